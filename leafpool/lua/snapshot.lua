-- snapshot.lua: one tag's keys read in one call (the status views and /metrics read
-- 10,000 tags this way: one command and one reply per tag instead of four).
--
-- KEYS[1]  ids      list of ready IDs (its length is read)
-- KEYS[2]  reserve  list of ranges (read whole)
-- KEYS[3]  state    hash (read whole)
-- KEYS[4]  lock     refill lock (whether it exists)
--
-- Returns {LLEN ids, LRANGE reserve 0 -1, HGETALL state (field, value, ...), EXISTS lock}.
-- Writes nothing.

return {
  redis.call('LLEN', KEYS[1]),
  redis.call('LRANGE', KEYS[2], 0, -1),
  redis.call('HGETALL', KEYS[3]),
  redis.call('EXISTS', KEYS[4]),
}
