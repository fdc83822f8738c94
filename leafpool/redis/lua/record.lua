-- record.lua: record fields and counters in a tag's state, only while the tag is
-- registered (its state has a mode). A refill still running when the tag sync drops the
-- tag would otherwise leave a stray state hash behind that nothing removes.
--
-- KEYS[1]  state    hash of the tag
-- ARGV[1]  n, how many field/value pairs follow to HSET: a canonical decimal with
--          2n + 1 <= #ARGV (checked)
-- ARGV[2 .. 2n+1]   field, value, ... (HSET; values recorded as given)
-- ARGV[2n+2 ..]     field, increment, ... (HINCRBY): an even number of strings (checked),
--                   each increment a canonical decimal no larger than 2^63 - 1 (checked;
--                   every caller adds, none subtracts), each field not also among the
--                   HSET fields of the call (checked)
--
-- Returns 1 when recorded, 0 when the tag is not registered (nothing written), or nothing
-- written and
--   -7  n or an increment is not a canonical decimal (or an increment is above 2^63 - 1)
--   -8  the arguments are inconsistent: 2n + 1 is more than #ARGV, the counters are not
--       field/increment pairs, or a field is both set and incremented
-- The arguments are checked before anything is written: HINCRBY would raise on a bad
-- increment after the HSET had run (a script is not rolled back). Not checked: a counter
-- whose stored value is not an integer, or a sum past 2^63 - 1 (Redis raises then).
--
-- Repeating the call after a lost reply is safe for the fields (HSET writes the same
-- values again) but NOT for the counters: HINCRBY is not idempotent, so a repeated
-- record counts twice.

-- @include decimal

if not dec(ARGV[1]) then return -7 end
local n = tonumber(ARGV[1])
if 2 * n + 1 > #ARGV or (#ARGV - 2 * n - 1) % 2 ~= 0 then return -8 end
local set = {}
for i = 2, 2 * n + 1, 2 do set[ARGV[i]] = true end
for i = 2 * n + 2, #ARGV, 2 do
  local by = ARGV[i + 1]
  if not dec(by) or gt(by, '9223372036854775807') then return -7 end
  if set[ARGV[i]] then return -8 end
end

if redis.call('HEXISTS', KEYS[1], 'mode') == 0 then return 0 end
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2, 2 * n + 1))
end
for i = 2 * n + 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
