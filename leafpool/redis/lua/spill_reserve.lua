-- spill_reserve.lua: the drop watcher moves one chunk from the head of the reserve into
-- the ready list of a tag that fell below its low-water mark, while no refill holds the
-- tag (docs/design.md §3.7): the IDs are in the list at once, not after the refill task's
-- Celery hop.
--
-- KEYS[1]  ids      list of ready IDs (the public LPOP interface)
-- KEYS[2]  reserve  list of "start:end" ranges (half-open) not yet pushed
-- KEYS[3]  state    hash; reads "hwm", writes "hwm", "pushed_total", "last_push_ms",
--                   "watch_pushed" (IDs the watcher moved, a counter) and "reserve_due" = 1:
--                   the reserve gave IDs no refill has replaced yet, so the tag stays due
--                   (the sweep and the watcher queue it again if its refill never runs)
--                   until a refill records the reserve as it leaves it
-- KEYS[4]  lock     the tag's refill lock: must not exist (any value)
-- ARGV[1]  the reserve head the caller read, "start:end"
-- ARGV[2]  the reserve head after this chunk: "" when the chunk uses the range up (last + 1
--          is the head's end), else exactly (last + 1) .. ":" .. end; checked
-- ARGV[3]  now, in milliseconds (a canonical decimal; written as "last_push_ms")
-- ARGV[4]  a bound: the list must hold fewer IDs than this (a canonical decimal): the
--          caller's low-water mark plus what it moved before this chunk, so a list a
--          refill filled since the caller read it gets nothing more
-- ARGV[5..] the IDs as decimal strings, contiguous and increasing from the head's start:
--          first = ARGV[5], last = ARGV[#ARGV], and their number (#ARGV - 4) must be
--          last - first + 1 (checked)
--
-- Returns the new length of the ids list (>= 0), or nothing written and
--   -9  the refill lock exists: a refill holds the tag (it fills the list; its pushes are
--       fenced by its token), or a lock of a former master waits for the refill queued
--       to take it over: the watcher writes under no token, so it never writes beside one
--   -10 the list holds ARGV[4] IDs or more
--   -2  the reserve head is not ARGV[1] (a refill or a client moved it, or this chunk was
--       already moved)
--   -3  the first ID is not above the tag's high-water mark
--   -6  the IDs do not lie in the head range
--   -7  the first or last ID, the head, now, the bound or the high-water mark is not a
--       canonical decimal
--   -8  the arguments are inconsistent: the number of IDs is not last - first + 1, or
--       ARGV[3] is not the head that follows last
--
-- The fence is push_ids.lua's (lib/chunk.lua: head, high-water mark, the two ends and
-- the count; the IDs
-- between are trusted to be the caller's run from the head's start), with the lock's
-- absence in place of the caller's token. Repeating the call after a lost reply is safe:
-- when the first run went through the head has moved, so the repeat is refused -2.

-- @include decimal
-- @include chunk

if redis.call('EXISTS', KEYS[4]) == 1 then return -9 end
if #ARGV < 5 or not (dec(ARGV[3]) and dec(ARGV[4])) then return -7 end
local len = redis.call('LLEN', KEYS[1])
if not gt(ARGV[4], tostring(len)) then return -10 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[1] then return -2 end

local refused = chunk_fence(head, ARGV[2], KEYS[3], ARGV[5], ARGV[#ARGV], #ARGV - 4)
if refused ~= 0 then return refused end
len = chunk_push(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], 'reserve_due', '1')
redis.call('HINCRBY', KEYS[3], 'watch_pushed', #ARGV - 4)
return len
