-- take_reserve.lua: a client takes IDs straight from the reserve head while the ready
-- list is empty (empty-pool policy "reserve"), keeping the pool's order.
--
-- KEYS[1]  ids      list of ready IDs; must be empty, or popping it stays in order
-- KEYS[2]  reserve  list of "start:end" ranges (half-open)
-- KEYS[3]  state    hash; reads "hwm", writes "hwm", "pushed_total", "reserve_takes"
-- ARGV[1]  the reserve head the caller read, "start:end"
-- ARGV[2]  the reserve head after the take: "" when the take uses the range up
--          (ARGV[4] + 1 is the head's end), else exactly (ARGV[4] + 1) .. ":" .. end;
--          checked
-- ARGV[3]  first ID taken (= the head's start), decimal string
-- ARGV[4]  last ID taken, decimal string
-- ARGV[5]  how many IDs are taken: a canonical decimal equal to ARGV[4] - ARGV[3] + 1
--          (checked; added to "pushed_total" and "reserve_takes")
--
-- Returns 1 when the IDs ARGV[3]..ARGV[4] are the caller's, or nothing written and
--   -2  the reserve head is not ARGV[1] (someone else moved it: read again)
--   -3  the first ID is not above the tag's high-water mark
--   -4  the ids list is not empty (pop it instead)
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the count, the head or the high-water mark is not a
--       canonical decimal
--   -8  the arguments are inconsistent: the count is not ARGV[4] - ARGV[3] + 1, or ARGV[2]
--       is not the head that follows ARGV[4]
--
-- NOT safe to repeat blindly after a lost reply: when the first run went through, the
-- head has moved and the repeat is refused -2, so the IDs of the first run are the
-- caller's but it never learns them: they are a gap the caller must count, never reuse.

-- @include decimal

if redis.call('LLEN', KEYS[1]) > 0 then return -4 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[1] then return -2 end
local first, last, count = ARGV[3], ARGV[4], ARGV[5]
if not (dec(first) and dec(last) and dec(count)) then return -7 end
local sep = string.find(head, ':', 1, true)
if not sep then return -7 end
local head_start, head_end = string.sub(head, 1, sep - 1), string.sub(head, sep + 1)
if not (dec(head_start) and dec(head_end)) then return -7 end
if first ~= head_start or not gt(head_end, last) or gt(first, last) then
  return -6
end
local after = add(last, 1)
if add(first, count) ~= after then return -8 end
if after == head_end then
  if ARGV[2] ~= '' then return -8 end
elseif ARGV[2] ~= after .. ':' .. head_end then
  return -8
end
local hwm = redis.call('HGET', KEYS[3], 'hwm')
if hwm and not dec(hwm) then return -7 end
if hwm and not gt(first, hwm) then return -3 end

if ARGV[2] == '' then
  redis.call('LPOP', KEYS[2])
else
  redis.call('LSET', KEYS[2], 0, ARGV[2])
end
redis.call('HSET', KEYS[3], 'hwm', last)
redis.call('HINCRBY', KEYS[3], 'pushed_total', count)
redis.call('HINCRBY', KEYS[3], 'reserve_takes', count)
return 1
