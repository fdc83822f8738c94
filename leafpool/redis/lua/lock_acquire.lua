-- lock_acquire.lua: take a lock (a tag's refill lock, the beat lock), recognise the
-- caller's own after a lost reply, or take over a lock left by a holder on a former
-- master or, for a holder that announced its presence, by a holder that is gone
-- (docs/design.md §3.1).
--
-- KEYS[1]  the lock
-- ARGV[1]  the caller's nonce for this acquire: 1 to 64 characters of [0-9a-f]
-- ARGV[2]  the TTL in ms, a canonical decimal from 1 to 3600000
-- ARGV[3]  optional (the beat lock): the caller's identity, its host or pod name, 1 to 255
--          characters of [A-Za-z0-9._-]. With it the caller announces its presence: it
--          has subscribed, before this call, to the channel KEYS[1] .. ':' .. ARGV[1], and
--          stays subscribed for as long as it holds the lock.
--
-- The value stored is "<nonce>@<replid>", or "<nonce>/<identity>@<replid>" with ARGV[3],
-- replid being this master's replication ID (INFO replication, master_replid); that whole
-- value is the holder's fencing token. A script of an earlier release reads everything
-- before the '@' as the holder's nonce: the identity form is another holder's lock to it.
--
-- Returns {code, value}:
--    1  taken: the lock was free; value is the caller's token
--    2  already the caller's (its nonce): an acquire repeated after its reply was lost;
--       the TTL is set again; value is the caller's token
--    3  taken over: the lock names another replication ID (40 hex digits, the form
--       of master_replid), so it was written on a
--       former master (a failover promoted this node, or it restarted and lost its
--       replication ID): its holder's connection went with that master, and every write
--       of that holder is fenced by the token it no longer matches; value is the
--       caller's token, and a third element the former holder's
--    4  taken over from a holder that is gone: the lock names a holder that announced its
--       presence, and nobody is subscribed to its channel any more (PUBSUB NUMSUB 0: its
--       connection closed, so its process died); value is the caller's token, and a third
--       element the former holder's
--    0  held by another holder on this master, or in a form this script does not
--       recognise (no replication ID after an '@': redis-py's Lock, which builds before
--       this form used, holds the lock with a bare token); value is the holder's token
--   -7  ARGV[1], ARGV[2] or ARGV[3] is malformed; nothing written
--
-- Safe to repeat after a lost reply: a repeat finds the caller's nonce (code 2).

local nonce, ttl, identity = ARGV[1], ARGV[2], ARGV[3]
if type(nonce) ~= 'string' or #nonce < 1 or #nonce > 64 or string.find(nonce, '[^0-9a-f]') then
  return {-7, ''}
end
if not string.find(ttl, '^[1-9]%d*$') or #ttl > 7 or tonumber(ttl) > 3600000 then
  return {-7, ''}
end
if identity ~= nil and (#identity < 1 or #identity > 255 or string.find(identity, '[^%w._-]')) then
  return {-7, ''}
end
local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ''
local mine = nonce .. '@' .. replid
if identity ~= nil then
  mine = nonce .. '/' .. identity .. '@' .. replid
end
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {1, mine}
end
local at = string.find(held, '@', 1, true)
local held_nonce = at and string.sub(held, 1, at - 1) or held
local held_replid = at and string.sub(held, at + 1) or ''
local slash = string.find(held_nonce, '/', 1, true)
if slash then
  held_nonce = string.sub(held_nonce, 1, slash - 1)
end
if held_nonce == nonce then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {2, mine}
end
-- a former master's lock names a replication ID (40 hex digits) that is not this
-- master's; a value naming none (redis-py's Lock, as builds before the nonce@replid form
-- held the locks with, or anything else unrecognised) is another holder's, waited out
if held_replid ~= replid and #held_replid == 40 and not string.find(held_replid, '[^0-9a-f]') then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {3, mine, held}
end
if slash and redis.call('PUBSUB', 'NUMSUB', KEYS[1] .. ':' .. held_nonce)[2] == 0 then
  redis.call('SET', KEYS[1], mine, 'PX', ttl)
  return {4, mine, held}
end
return {0, held}
