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
