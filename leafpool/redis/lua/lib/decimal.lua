-- lib/decimal.lua: decimal-string helpers, included by the scripts that compare IDs.
--
-- Included where a script says "-- @include decimal" (leafpool/redis/scripts.py puts this text
-- there when the script is loaded); defines two local functions and touches no key.
--
--   dec(s)    true when s is a canonical non-negative decimal: "0", or a digit 1-9
--             followed by digits (no sign, no leading zero, no space), at most 19 digits
--   gt(a, b)  a > b for two canonical decimals (compares lengths, then bytes)
--
-- IDs are compared as strings because Lua numbers are doubles, exact only to 2^53, and
-- IDs span the signed 64-bit range. gt() is only meaningful for canonical decimals:
-- every script checks its inputs with dec() before it compares them.

local function dec(s)
  if type(s) ~= 'string' or #s == 0 or #s > 19 then return false end
  if s == '0' then return true end
  return string.find(s, '^[1-9]%d*$') ~= nil
end

local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
