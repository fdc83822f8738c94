-- lock_acquire.lua: take a lock (a tag's refill lock, the beat lock), recognise the
-- caller's own after a lost reply, or take over a lock left by a holder on a former
-- master (docs/design.md §3.1).
--
-- KEYS[1]  the lock
-- ARGV[1]  the caller's nonce for this acquire: 1 to 64 characters of [0-9a-f]
-- ARGV[2]  the TTL in ms, a canonical decimal from 1 to 3600000
--
-- The value stored is "<nonce>@<replid>", replid being this master's replication ID
-- (INFO replication, master_replid); that whole value is the holder's fencing token.
--
-- Returns {code, value}:
--    1  taken: the lock was free; value is the caller's token
--    2  already the caller's (its nonce): an acquire repeated after its reply was lost;
--       the TTL is set again; value is the caller's token
--    3  taken over: the lock names another replication ID, so it was written on a
--       former master (a failover promoted this node, or it restarted and lost its
--       replication ID): its holder's connection went with that master, and every write
--       of that holder is fenced by the token it no longer matches; value is the
--       caller's token, and a third element the former holder's
--    0  held by another holder on this master; value is the holder's token
--   -7  ARGV[1] or ARGV[2] is malformed; nothing written
--
-- Safe to repeat after a lost reply: a repeat finds the caller's nonce (code 2).

local nonce, ttl = ARGV[1], ARGV[2]
if type(nonce) ~= 'string' or #nonce < 1 or #nonce > 64 or string.find(nonce, '[^0-9a-f]') then
  return {-7, ''}
end
if not string.find(ttl, '^[1-9]%d*$') or #ttl > 7 or tonumber(ttl) > 3600000 then
  return {-7, ''}
end
local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ''
local mine = nonce .. '@' .. replid
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {1, mine}
end
local at = string.find(held, '@', 1, true)
local held_nonce = at and string.sub(held, 1, at - 1) or held
local held_replid = at and string.sub(held, at + 1) or ''
if held_nonce == nonce then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {2, mine}
end
if held_replid ~= replid then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {3, mine, held}
end
return {0, held}
