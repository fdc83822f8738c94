-- record.lua: record fields and counters in a tag's state, only while the tag is
-- registered (its state has a mode). A refill still running when the tag sync drops the
-- tag would otherwise leave a stray state hash behind that nothing removes.
--
-- KEYS[1]  state    hash of the tag
-- ARGV[1]  n, how many field/value pairs follow to HSET
-- ARGV[2 .. 2n+1]   field, value, ... (HSET)
-- ARGV[2n+2 ..]     field, increment, ... (HINCRBY)
--
-- Returns 1 when recorded, 0 when the tag is not registered (nothing written).

if redis.call('HEXISTS', KEYS[1], 'mode') == 0 then return 0 end
local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2, 2 * n + 1))
end
for i = 2 * n + 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
