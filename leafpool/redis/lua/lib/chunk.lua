-- lib/chunk.lua: the fence and the push of one chunk of IDs from the head of a tag's
-- reserve into its list, shared by push_ids.lua and push_range.lua (a refill, under its
-- lock token) and spill_reserve.lua (the drop watcher, while no lock exists). Included
-- after "decimal".
--
--   chunk_fence(head, next_head, state, first, last, count)
--            0 when the chunk first .. last (canonical decimals, `count` IDs, contiguous
--            and increasing from the head's start) may be pushed: it starts at the head
--            range's start and ends inside it, count is last - first + 1, next_head is
--            the head that follows it ("" when it uses the range up), and first is above
--            the high-water mark in the hash `state`; else the refusal code (-3 not above
--            the mark, -6 not in the head range, -7 not canonical, -8 inconsistent).
--            Only the two ends and the count are checked.
--   chunk_push(ids, reserve, state, next_head, now)
--            RPUSHes ARGV[5..] onto `ids` (1,000 arguments a call) and moves the head on
--            (chunk_advance); returns the list's new length.
--   chunk_push_range(ids, reserve, state, next_head, now, first, last, count)
--            RPUSHes the IDs first .. last (canonical decimals below 2^53: Lua's numbers
--            are exact there), each as string.format '%d' writes it (never "1e+15"),
--            1,000 a call, and moves the head on (chunk_advance); returns the list's new
--            length.
--   chunk_advance(reserve, state, next_head, now, last, count)
--            moves the reserve's head on (LPOP, or LSET to next_head) and records "hwm"
--            (= last), "last_push_ms" and "pushed_total" (+ count) in `state`.
--
-- A script calls chunk_fence, and only when it returned 0 writes the chunk's IDs and
-- calls chunk_advance (chunk_push does both for IDs given in ARGV[5..], chunk_push_range
-- for IDs generated from the two ends).

local function chunk_fence(head, next_head, state, first, last, count)
  if not (dec(first) and dec(last)) then return -7 end
  local sep = string.find(head, ':', 1, true)
  if not sep then return -7 end
  local head_start, head_end = string.sub(head, 1, sep - 1), string.sub(head, sep + 1)
  if not (dec(head_start) and dec(head_end)) then return -7 end
  if first ~= head_start or not gt(head_end, last) then return -6 end

  local after = add(last, 1)
  if add(first, count) ~= after then return -8 end
  if after == head_end then
    if next_head ~= '' then return -8 end
  elseif next_head ~= after .. ':' .. head_end then
    return -8
  end

  local hwm = redis.call('HGET', state, 'hwm')
  if hwm and not dec(hwm) then return -7 end
  if hwm and not gt(first, hwm) then return -3 end
  return 0
end

local function chunk_advance(reserve, state, next_head, now, last, count)
  if next_head == '' then
    redis.call('LPOP', reserve)
  else
    redis.call('LSET', reserve, 0, next_head)
  end
  redis.call('HSET', state, 'hwm', last, 'last_push_ms', now)
  redis.call('HINCRBY', state, 'pushed_total', count)
end

local function chunk_push(ids, reserve, state, next_head, now)
  local len = 0
  for i = 5, #ARGV, 1000 do
    local j = math.min(i + 999, #ARGV)
    len = redis.call('RPUSH', ids, unpack(ARGV, i, j))
  end
  chunk_advance(reserve, state, next_head, now, ARGV[#ARGV], #ARGV - 4)
  return len
end

local function chunk_push_range(ids, reserve, state, next_head, now, first, last, count)
  local batch, n, len = {}, 0, 0
  for id = tonumber(first), tonumber(last) do
    n = n + 1
    batch[n] = string.format('%d', id)
    if n == 1000 then
      len = redis.call('RPUSH', ids, unpack(batch, 1, n))
      n = 0
    end
  end
  if n > 0 then len = redis.call('RPUSH', ids, unpack(batch, 1, n)) end
  chunk_advance(reserve, state, next_head, now, last, count)
  return len
end
