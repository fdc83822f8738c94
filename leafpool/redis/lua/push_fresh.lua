-- push_fresh.lua: push freshly generated IDs (snowflake mode) into the ready list.
--
-- KEYS[1]  ids      list of ready IDs (the public LPOP interface)
-- KEYS[2]  state    hash; reads "hwm", writes "hwm", "pushed_total", "last_push_ms"
-- KEYS[3]  lock     refill lock; its value must be the caller's token (fencing)
-- ARGV[1]  the caller's lock token
-- ARGV[2]  now, in milliseconds (a canonical decimal; written as "last_push_ms")
-- ARGV[3..] the IDs as decimal strings, strictly increasing
--
-- Returns the new length of the ids list (>= 0), or nothing written and
--   -1  the lock is not held with this token
--   -3  the first ID is not above the tag's high-water mark
--   -6  the IDs are not strictly increasing
--   -7  an ID, now or the high-water mark is not a canonical decimal
--
-- IDs are compared as decimal strings (lib/decimal.lua): Lua numbers are doubles. Every
-- value written follows from the IDs (the mark is the last, the count is their number)
-- except now, which is checked to be a canonical decimal.
--
-- Repeating the call after a lost reply is refused -3 and writes nothing when the first
-- run went through: the high-water mark is then the last of these IDs.

-- @include decimal

if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
if #ARGV < 3 or not dec(ARGV[2]) then return -7 end
for i = 3, #ARGV do
  if not dec(ARGV[i]) then return -7 end
end
local hwm = redis.call('HGET', KEYS[2], 'hwm')
if hwm and not dec(hwm) then return -7 end
if hwm and not gt(ARGV[3], hwm) then return -3 end
for i = 4, #ARGV do
  if not gt(ARGV[i], ARGV[i - 1]) then return -6 end
end

local len = 0
for i = 3, #ARGV, 1000 do
  local j = math.min(i + 999, #ARGV)
  len = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, j))
end
redis.call('HSET', KEYS[2], 'hwm', ARGV[#ARGV], 'last_push_ms', ARGV[2])
redis.call('HINCRBY', KEYS[2], 'pushed_total', #ARGV - 2)
return len
