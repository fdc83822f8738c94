-- trim_reserve.lua: drop ranges from the head of the reserve that are not to be pushed
-- (a snowflake tag's reserve, docs/design.md §8.7): every head range that starts at or
-- below the tag's high-water mark (IDs above it were pushed without the reserve, by a
-- refiller that keeps none: push_ids would refuse it for ever, and take_reserve too), and,
-- with ARGV[2] given, every head range that ends at or below ARGV[2] (older than the
-- tag's age limit: its refiller replaces them with fresh ones). The dropped IDs are a gap,
-- never handed out.
--
-- KEYS[1]  reserve  list of "start:end" ranges (half-open)
-- KEYS[2]  state    hash; reads "hwm"
-- KEYS[3]  lock     refill lock; its value must be the caller's token (fencing)
-- ARGV[1]  the caller's lock token
-- ARGV[2]  "" (none), or a canonical decimal: drop head ranges whose end is at or below it
-- ARGV[3]  at most this many ranges dropped in this call: a canonical decimal, 1 to 10000
--          (the caller calls again while the reply equals it)
--
-- Returns the number of ranges dropped (>= 0), or
--   -1  the lock is not held with this token (nothing written)
--   -7  ARGV[2], ARGV[3] or the high-water mark is not a canonical decimal, or ARGV[3]
--       is out of its bounds (nothing written); or a head range is not "start:end" of
--       canonical decimals (the trim stops there: ranges dropped before it stay dropped)
--
-- Repeating the call after a lost reply is safe: the ranges it drops are the head ranges
-- that meet the same conditions, so a repeat of a call that landed drops only what
-- meets them still (nothing, unless the caller appended such ranges meanwhile).

-- @include decimal

if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
local below = ARGV[2]
if below ~= '' and not dec(below) then return -7 end
if not dec(ARGV[3]) or gt(ARGV[3], '10000') or ARGV[3] == '0' then return -7 end
local limit = tonumber(ARGV[3])
local hwm = redis.call('HGET', KEYS[2], 'hwm')
if hwm and not dec(hwm) then return -7 end

local dropped = 0
while dropped < limit do
  local head = redis.call('LINDEX', KEYS[1], 0)
  if not head then break end
  local sep = string.find(head, ':', 1, true)
  if not sep then return -7 end
  local head_start, head_end = string.sub(head, 1, sep - 1), string.sub(head, sep + 1)
  if not (dec(head_start) and dec(head_end)) then return -7 end
  local stale = hwm and not gt(head_start, hwm)
  local old = below ~= '' and not gt(head_end, below)
  if not (stale or old) then break end
  redis.call('LPOP', KEYS[1])
  dropped = dropped + 1
end
return dropped
