-- drop.lua: delete a tag's keys, only while its state is the one the caller read.
--
-- KEYS[1]  state    hash of the tag; its "created_ms" is compared with ARGV[1]
-- KEYS[2..] every other key of the tag (ids, reserve, lock, queued)
-- ARGV[1]  the "created_ms" the caller read ("" for a state without it), or "*" to
--          drop whatever the state is
--
-- Returns 1 when the keys were deleted: the state had that created_ms, or no longer
-- exists at all (the tag was dropped already, say by this same call whose reply was
-- lost; the other keys are deleted anyway), or ARGV[1] is "*". Returns 0 when the tag was
-- registered again meanwhile (a state with another created_ms: nothing deleted). The
-- caller then removes the tag from the global sets (other hash slots in a Redis Cluster,
-- so not from this script).
--
-- Repeating the call after a lost reply is safe: the repeat finds no state and returns 1
-- again (deleting whatever is left), so the caller goes on to the global sets.

if ARGV[1] ~= '*' and redis.call('EXISTS', KEYS[1]) == 1 then
  local created = redis.call('HGET', KEYS[1], 'created_ms') or ''
  if created ~= ARGV[1] then return 0 end
end
redis.call('DEL', unpack(KEYS))
return 1
