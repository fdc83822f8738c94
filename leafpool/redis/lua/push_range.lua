-- push_range.lua: move one chunk from the head of the reserve into the ready list, the IDs
-- generated here from the chunk's first and last (push_ids.lua sends every ID).
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
-- ARGV[5]  the chunk's first ID: the head's start (checked)
-- ARGV[6]  the chunk's last ID: at least the first, below 2^53, and at most 100,000 IDs
--          in all (last - first + 1 <= 100,000)
--
-- Returns the new length of the ids list (>= 0), or nothing written and
--   -1  the lock is not held with this token (expired, or taken by another refiller)
--   -2  the reserve head is not ARGV[2] (this chunk was already pushed, or taken)
--   -3  the first ID is not above the tag's high-water mark
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the head, now or the high-water mark is not a canonical
--       decimal
--   -8  the arguments are inconsistent: not six of them, last below first, more than
--       100,000 IDs, or ARGV[3] is not the head that follows last
--   -11 the last ID is 2^53 or above: Lua's numbers (doubles) are exact only below it;
--       such a chunk goes by push_ids.lua
--
-- The fence is push_ids.lua's (lib/chunk.lua: lock token, head, high-water mark, the two
-- ends and the count), so refillers of either script fence each other on one tag exactly
-- as they fence themselves; what is written is the same: the IDs first .. last in order,
-- each as its canonical decimal (string.format '%d': exact below 2^53, never "1e+15"),
-- and the same head, mark and counters.
--
-- Repeating the call after a lost reply is safe: when the first run went through the head
-- has moved, so the repeat is refused -2 and writes nothing.

-- @include decimal
-- @include chunk

if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[2] then return -2 end
if #ARGV ~= 6 then return -8 end
local first, last = ARGV[5], ARGV[6]
if not (dec(ARGV[4]) and dec(first) and dec(last)) then return -7 end
if gt(last, '9007199254740991') then return -11 end
local from, to = tonumber(first), tonumber(last)
local count = to - from + 1
if count < 1 or count > 100000 then return -8 end

local refused = chunk_fence(head, ARGV[3], KEYS[3], first, last, count)
if refused ~= 0 then return refused end

return chunk_push_range(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[4], first, last, count)
