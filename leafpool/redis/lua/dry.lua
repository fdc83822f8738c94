-- dry.lua: record whether a tag's list is dry (empty after IDs were pushed into it), as
-- the list is at the moment the script runs. Plain LPOPs of an empty list change nothing
-- in Redis, so no count of them exists; what can be known is when the list went empty
-- and for how long (docs/design.md §3.8). Called by the drop watcher and the sweep when
-- a level they read disagrees with the mark, and by the refiller after each refill.
--
-- KEYS[1]  ids      the tag's list of ready IDs
-- KEYS[2]  state    hash of the tag
-- ARGV[1]  now, ms since the epoch: a canonical decimal (checked)
--
-- Returns
--    1  marked dry: the list is empty, IDs were pushed before (pushed_total > 0) and no
--       dry_since_ms was set: dry_since_ms = now
--   -1  marked no longer dry: the list holds IDs and dry_since_ms was set: it is cleared,
--       last_dry_ms = that time, last_dry_end_ms = now, dry_events + 1 and dry_ms + the
--       period (now - dry_since_ms; 0 when the clocks disagree)
--    0  nothing to change (or the tag is not registered: its state has no mode)
--   -7  now is not a canonical decimal (nothing written)
--
-- Repeating the call after a lost reply is safe: the first run changed the mark, so a
-- repeat finds nothing to change (the counters are added once per period).

-- @include decimal

if not dec(ARGV[1]) then return -7 end
if redis.call('HEXISTS', KEYS[2], 'mode') == 0 then return 0 end
local since = redis.call('HGET', KEYS[2], 'dry_since_ms')
if since == false then since = '' end
if redis.call('LLEN', KEYS[1]) == 0 then
  if since ~= '' then return 0 end
  local pushed = redis.call('HGET', KEYS[2], 'pushed_total')
  if not pushed or not dec(pushed) or pushed == '0' then return 0 end
  redis.call('HSET', KEYS[2], 'dry_since_ms', ARGV[1])
  return 1
end
if since == '' then return 0 end
local lasted = 0
if dec(since) and not gt(since, ARGV[1]) then lasted = math.floor(tonumber(ARGV[1]) - tonumber(since)) end
redis.call('HSET', KEYS[2], 'dry_since_ms', '', 'last_dry_ms', since, 'last_dry_end_ms', ARGV[1])
redis.call('HINCRBY', KEYS[2], 'dry_events', 1)
redis.call('HINCRBY', KEYS[2], 'dry_ms', lasted)
return -1
