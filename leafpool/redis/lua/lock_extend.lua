-- lock_extend.lua: renew a lock's TTL while the caller holds it.
--
-- KEYS[1]  the lock
-- ARGV[1]  the caller's token (the value lock_acquire.lua stored)
-- ARGV[2]  the new TTL in ms, a canonical decimal from 1 to 3600000
--
-- Returns 1 when renewed, 0 when the lock is gone or another's (nothing written),
-- -7 when ARGV[2] is malformed.
--
-- Safe to repeat after a lost reply: PEXPIRE to the same TTL again.

local ttl = ARGV[2]
if not string.find(ttl, '^[1-9]%d*$') or #ttl > 7 or tonumber(ttl) > 3600000 then
  return -7
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
