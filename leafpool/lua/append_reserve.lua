-- append_reserve.lua: append a range freshly allocated from the database to the reserve.
--
-- KEYS[1]  reserve  list of "start:end" ranges (half-open)
-- KEYS[2]  state    hash; reads "hwm", HSETs the field/value pairs of ARGV[4..]
-- KEYS[3]  lock     refill lock; its value must be the caller's token (fencing)
-- ARGV[1]  the caller's lock token
-- ARGV[2]  range start (decimal string)
-- ARGV[3]  range end, exclusive (decimal string)
-- ARGV[4..] field, value, field, value ... recorded in state with the append
--
-- Returns the new length of the reserve list (>= 1), or nothing written and
--   -1  the lock is not held with this token
--   -3  the range start is not above the tag's high-water mark
--   -5  the range starts below the end of the last reserved range
--
-- A refused range is dropped by the caller: a gap, never a repeat (G3).

local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
local start = ARGV[2]
local hwm = redis.call('HGET', KEYS[2], 'hwm')
if hwm and not gt(start, hwm) then return -3 end
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then
  local tail_end = string.sub(tail, string.find(tail, ':', 1, true) + 1)
  if gt(tail_end, start) then return -5 end
end
if #ARGV > 3 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 4))
end
return redis.call('RPUSH', KEYS[1], start .. ':' .. ARGV[3])
