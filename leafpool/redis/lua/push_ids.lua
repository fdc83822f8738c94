-- push_ids.lua: move one chunk from the head of the reserve into the ready list.
--
-- KEYS[1]  ids      list of ready IDs (the public LPOP interface)
-- KEYS[2]  reserve  list of "start:end" ranges (half-open) not yet pushed
-- KEYS[3]  state    hash; reads "hwm", writes "hwm", "pushed_total", "last_push_ms"
-- KEYS[4]  lock     refill lock; its value must be the caller's token (fencing)
-- ARGV[1]  the caller's lock token
-- ARGV[2]  the reserve head the caller read, "start:end"
-- ARGV[3]  the reserve head after this chunk: "" when the chunk uses the range up (last + 1
--          is the head's end), else exactly (last + 1) .. ":" .. end; checked
-- ARGV[4]  now, in milliseconds (a canonical decimal; written as "last_push_ms")
-- ARGV[5..] the IDs as decimal strings, contiguous and increasing from the head's start:
--          first = ARGV[5], last = ARGV[#ARGV], and their number (#ARGV - 4) must be
--          last - first + 1 (checked)
--
-- Returns the new length of the ids list (>= 0), or nothing written and
--   -1  the lock is not held with this token (expired, or taken by another refiller)
--   -2  the reserve head is not ARGV[2] (this chunk was already pushed, or taken)
--   -3  the first ID is not above the tag's high-water mark
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the head, now or the high-water mark is not a canonical
--       decimal
--   -8  the arguments are inconsistent: the number of IDs is not last - first + 1, or
--       ARGV[3] is not the head that follows last
--
-- IDs are compared as decimal strings (lib/decimal.lua). The IDs between the first and
-- the last are trusted to be the caller's contiguous run from the head's start; only the
-- two ends and the count take part in the fence, so only they are checked (checking 1,000
-- strings per push would double the time Redis is busy with it).
--
-- Repeating the call after a lost reply is safe: when the first run went through the head
-- has moved, so the repeat is refused -2 and writes nothing.

-- @include decimal
-- @include chunk

if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[2] then return -2 end
if #ARGV < 5 or not dec(ARGV[4]) then return -7 end

local refused = chunk_fence(head, ARGV[3], KEYS[3], ARGV[5], ARGV[#ARGV], #ARGV - 4)
if refused ~= 0 then return refused end
return chunk_push(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[4])
