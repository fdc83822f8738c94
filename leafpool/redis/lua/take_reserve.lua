-- take_reserve.lua: a client takes IDs straight from the reserve head while the ready
-- list is empty (empty-pool policy "reserve"), keeping the pool's order.
--
-- KEYS[1]  ids      list of ready IDs; must be empty, or popping it stays in order
-- KEYS[2]  reserve  list of "start:end" ranges (half-open)
-- KEYS[3]  state    hash; reads "hwm", writes "hwm", "pushed_total", "reserve_takes"
-- ARGV[1]  the reserve head the caller read, "start:end"
-- ARGV[2]  the reserve head after the take, "" when the range is used up
-- ARGV[3]  first ID taken (= the head's start), decimal string
-- ARGV[4]  last ID taken, decimal string
-- ARGV[5]  how many IDs are taken
--
-- Returns 1 when the IDs ARGV[3]..ARGV[4] are the caller's, or nothing written and
--   -2  the reserve head is not ARGV[1] (someone else moved it: read again)
--   -3  the first ID is not above the tag's high-water mark
--   -4  the ids list is not empty (pop it instead)
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the head or the high-water mark is not a canonical decimal

-- @include decimal

if redis.call('LLEN', KEYS[1]) > 0 then return -4 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[1] then return -2 end
if not (dec(ARGV[3]) and dec(ARGV[4])) then return -7 end
local sep = string.find(head, ':', 1, true)
if not sep then return -7 end
local head_start, head_end = string.sub(head, 1, sep - 1), string.sub(head, sep + 1)
if not (dec(head_start) and dec(head_end)) then return -7 end
if ARGV[3] ~= head_start or not gt(head_end, ARGV[4]) or gt(ARGV[3], ARGV[4]) then
  return -6
end
local hwm = redis.call('HGET', KEYS[3], 'hwm')
if hwm and not dec(hwm) then return -7 end
if hwm and not gt(ARGV[3], hwm) then return -3 end

if ARGV[2] == '' then
  redis.call('LPOP', KEYS[2])
else
  redis.call('LSET', KEYS[2], 0, ARGV[2])
end
redis.call('HSET', KEYS[3], 'hwm', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'pushed_total', ARGV[5])
redis.call('HINCRBY', KEYS[3], 'reserve_takes', ARGV[5])
return 1
