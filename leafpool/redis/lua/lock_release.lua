-- lock_release.lua: release a lock the caller holds (compare and delete).
--
-- KEYS[1]  the lock
-- ARGV[1]  the caller's token (the value lock_acquire.lua stored)
--
-- Returns 1 when released, 2 when the lock was already free, 0 when another holder has
-- it (nothing deleted).
--
-- Safe to repeat after a lost reply: a repeat finds the lock free (2).

local held = redis.call('GET', KEYS[1])
if not held then return 2 end
if held ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
