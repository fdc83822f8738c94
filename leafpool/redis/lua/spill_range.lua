-- spill_range.lua: spill_reserve.lua with the IDs generated here from the chunk's first
-- and last (spill_reserve.lua is sent every ID), as push_range.lua is to push_ids.lua:
-- the drop watcher moves one chunk from the head of the reserve into the ready list of a
-- tag that fell below its low-water mark, while no refill holds the tag (docs/design.md
-- §3.7).
--
-- KEYS[1]  ids      list of ready IDs (the public LPOP interface)
-- KEYS[2]  reserve  list of "start:end" ranges (half-open) not yet pushed
-- KEYS[3]  state    hash; reads "hwm", writes "hwm", "pushed_total", "last_push_ms",
--                   "watch_pushed" (IDs the watcher moved, a counter) and "reserve_due" = 1
--                   (as spill_reserve.lua)
-- KEYS[4]  lock     the tag's refill lock: must not exist (any value)
-- ARGV[1]  the reserve head the caller read, "start:end"
-- ARGV[2]  the reserve head after this chunk: "" when the chunk uses the range up (last + 1
--          is the head's end), else exactly (last + 1) .. ":" .. end; checked
-- ARGV[3]  now, in milliseconds (a canonical decimal; written as "last_push_ms")
-- ARGV[4]  a bound: the list must hold fewer IDs than this (a canonical decimal)
-- ARGV[5]  the chunk's first ID: the head's start (checked)
-- ARGV[6]  the chunk's last ID: at least the first, below 2^53, and at most 100,000 IDs
--          in all (last - first + 1 <= 100,000)
--
-- Returns the new length of the ids list (>= 0), or nothing written and
--   -9  the refill lock exists (the watcher writes under no token, never beside one)
--   -10 the list holds ARGV[4] IDs or more
--   -2  the reserve head is not ARGV[1]
--   -3  the first ID is not above the tag's high-water mark
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the head, now, the bound or the high-water mark is not a
--       canonical decimal
--   -8  the arguments are inconsistent: not six of them, last below first, more than
--       100,000 IDs, or ARGV[2] is not the head that follows last
--   -11 the last ID is 2^53 or above: such a chunk goes by spill_reserve.lua
--
-- The checks are spill_reserve.lua's, in its order, and the fence and the push are
-- lib/chunk.lua's (chunk_fence, chunk_push_range: push_range.lua's); what is written is
-- spill_reserve.lua's. Repeating the call after a lost reply is safe: when the first run
-- went through the head has moved, so the repeat is refused -2.

-- @include decimal
-- @include chunk

if redis.call('EXISTS', KEYS[4]) == 1 then return -9 end
if #ARGV ~= 6 then return -8 end
if not (dec(ARGV[3]) and dec(ARGV[4])) then return -7 end
local len = redis.call('LLEN', KEYS[1])
if not gt(ARGV[4], tostring(len)) then return -10 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[1] then return -2 end
local first, last = ARGV[5], ARGV[6]
if not (dec(first) and dec(last)) then return -7 end
if gt(last, '9007199254740991') then return -11 end
local count = tonumber(last) - tonumber(first) + 1
if count < 1 or count > 100000 then return -8 end

local refused = chunk_fence(head, ARGV[2], KEYS[3], first, last, count)
if refused ~= 0 then return refused end
len = chunk_push_range(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], first, last, count)
redis.call('HSET', KEYS[3], 'reserve_due', '1')
redis.call('HINCRBY', KEYS[3], 'watch_pushed', count)
return len
