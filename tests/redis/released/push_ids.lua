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

-- lib/decimal.lua: decimal-string helpers, included by the scripts that compare IDs.
--
-- Included where a script says "-- @include decimal" (leafpool/redis/scripts.py puts this text
-- there when the script is loaded); defines three local functions and touches no key.
--
--   dec(s)     true when s is a canonical non-negative decimal: "0", or a digit 1-9
--              followed by digits (no sign, no leading zero, no space), at most 19 digits
--   gt(a, b)   a > b for two canonical decimals (compares lengths, then bytes)
--   add(s, n)  s + n, exactly, as a canonical decimal string: s a canonical decimal
--              (dec(s)), n a small non-negative integer, at most 10^9, given as a Lua
--              number or as a canonical decimal string of at most 9 digits. The sum is
--              worked out digit by digit, so it is exact across the whole 64-bit range; it
--              may have 20 digits (s near 10^19), which dec() refuses: a caller compares
--              it with a value it checked with dec(), so such a sum never matches.
--              nil when s or n is not valid (a caller treats nil as "does not match").
--
-- IDs are compared as strings because Lua numbers are doubles, exact only to 2^53, and
-- IDs span the signed 64-bit range. gt() is only meaningful for canonical decimals:
-- every script checks its inputs with dec() before it compares them. The scripts check a
-- value they write against the values it follows from with add() (the new reserve head
-- against the last ID handed out, a count against the first and last ID).

local function dec(s)
  if type(s) ~= 'string' or #s == 0 or #s > 19 then return false end
  if s == '0' then return true end
  return string.find(s, '^[1-9]%d*$') ~= nil
end

local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

local function add(s, n)
  if type(n) == 'string' then
    if #n > 9 or not dec(n) then return nil end
    n = tonumber(n)
  end
  if type(n) ~= 'number' or n < 0 or n > 1000000000 or n % 1 ~= 0 then return nil end
  if not dec(s) then return nil end
  local digits, carry = {}, n
  for i = #s, 1, -1 do
    local v = string.byte(s, i) - 48 + carry
    digits[#digits + 1] = v % 10
    carry = (v - v % 10) / 10
  end
  while carry > 0 do
    digits[#digits + 1] = carry % 10
    carry = (carry - carry % 10) / 10
  end
  local out = {}
  for i = #digits, 1, -1 do out[#out + 1] = string.char(48 + digits[i]) end
  return table.concat(out)
end

if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local head = redis.call('LINDEX', KEYS[2], 0)
if head ~= ARGV[2] then return -2 end

local first, last = ARGV[5], ARGV[#ARGV]
if #ARGV < 5 or not (dec(first) and dec(last) and dec(ARGV[4])) then return -7 end
local sep = string.find(head, ':', 1, true)
if not sep then return -7 end
local head_start, head_end = string.sub(head, 1, sep - 1), string.sub(head, sep + 1)
if not (dec(head_start) and dec(head_end)) then return -7 end
if first ~= head_start or not gt(head_end, last) then return -6 end

local after = add(last, 1)
if add(first, #ARGV - 4) ~= after then return -8 end
if after == head_end then
  if ARGV[3] ~= '' then return -8 end
elseif ARGV[3] ~= after .. ':' .. head_end then
  return -8
end

local hwm = redis.call('HGET', KEYS[3], 'hwm')
if hwm and not dec(hwm) then return -7 end
if hwm and not gt(first, hwm) then return -3 end

local len = 0
for i = 5, #ARGV, 1000 do
  local j = math.min(i + 999, #ARGV)
  len = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, j))
end

if ARGV[3] == '' then
  redis.call('LPOP', KEYS[2])
else
  redis.call('LSET', KEYS[2], 0, ARGV[3])
end
redis.call('HSET', KEYS[3], 'hwm', last, 'last_push_ms', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'pushed_total', #ARGV - 4)
return len
