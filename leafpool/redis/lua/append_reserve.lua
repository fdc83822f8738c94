-- append_reserve.lua: append a range freshly allocated from the database to the reserve.
--
-- KEYS[1]  reserve  list of "start:end" ranges (half-open)
-- KEYS[2]  state    hash; reads "hwm", HSETs the field/value pairs of ARGV[4..]
-- KEYS[3]  lock     refill lock; its value must be the caller's token (fencing)
-- ARGV[1]  the caller's lock token
-- ARGV[2]  range start (decimal string)
-- ARGV[3]  range end, exclusive (decimal string)
-- ARGV[4..] field, value, field, value ... recorded in state with the append: an even
--          number of strings; a "max_id" field must be the range end (ARGV[3]) and a
--          "step" field the range's size, end - start (at most 10^9); both checked,
--          other fields are recorded as given
--
-- Returns the new length of the reserve list (>= 1), or nothing written and
--   -1  the lock is not held with this token
--   -3  the range start is not above the tag's high-water mark
--   -5  the range starts below the end of the last reserved range
--   -7  start, end, the high-water mark or the reserve tail is not a canonical decimal,
--       or end is not above start
--   -8  the arguments are inconsistent: an odd number of field/value strings, a "max_id"
--       that is not the range end or a "step" that is not end - start
--
-- A refused range is dropped by the caller: a gap, never a repeat (G3).
--
-- Repeating the call after a lost reply is refused and writes nothing when the first run
-- went through: the reserve's tail is then this range's end (-5), or the range was pushed
-- meanwhile and the high-water mark is above its start (-3); the range is not appended
-- twice.

-- @include decimal

if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
local start, stop = ARGV[2], ARGV[3]
if not (dec(start) and dec(stop) and gt(stop, start)) then return -7 end
if (#ARGV - 3) % 2 ~= 0 then return -8 end
for i = 4, #ARGV, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  if field == 'max_id' and value ~= stop then return -8 end
  if field == 'step' and add(start, value) ~= stop then return -8 end
end
local hwm = redis.call('HGET', KEYS[2], 'hwm')
if hwm and not dec(hwm) then return -7 end
if hwm and not gt(start, hwm) then return -3 end
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then
  local sep = string.find(tail, ':', 1, true)
  local tail_end = sep and string.sub(tail, sep + 1)
  if not dec(tail_end) then return -7 end
  if gt(tail_end, start) then return -5 end
end
if #ARGV > 3 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 4))
end
return redis.call('RPUSH', KEYS[1], start .. ':' .. stop)
