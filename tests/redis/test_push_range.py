"""push_range.lua: a chunk of the reserve's head pushed with its IDs generated in Redis from
the first and last (below 2^53), behind push_ids.lua's fence (lib/chunk.lua); the Pool's
choice between the two scripts; a run of chunks in one pipeline; and refillers of the
previous release (its push_ids.lua, verbatim) beside the new script and clients on one
tag, handing out no ID twice. Against a real redis-server."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from leafpool.core.config import load_settings
from leafpool.core.errors import StaleWrite
from leafpool.core.keys import Keys
from leafpool.redis import scripts
from leafpool.redis.connect import connect
from leafpool.redis.pool import RANGE_LIMIT, Pool
from leafpool.redis.pool_common import Range
from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]

K = Keys("leafpool").tag("t")
TOKEN = b"token"
NOW = "1700000000000"
P53 = 2**53
MAX = 2**63 - 1
#: the previous release's push_ids.lua (its lib/decimal.lua in place of the include)
RELEASED_PUSH_IDS = (Path(__file__).parent / "released" / "push_ids.lua").read_text()


def _range(r: redis.Redis, head: str, new_head: str, first: object, last: object,
           *extra: str, token: bytes = TOKEN, now: str = NOW) -> object:
    return r.eval(scripts.source("push_range"), 4, K.ids, K.reserve, K.state, K.lock,
                  token, head, new_head, now, str(first), str(last), *extra)


def _ids(r: redis.Redis, head: str, new_head: str, first: int, last: int,
         source: str | None = None) -> object:
    return r.eval(source or scripts.source("push_ids"), 4, K.ids, K.reserve, K.state, K.lock,
                  TOKEN, head, new_head, NOW, *(str(i) for i in range(first, last + 1)))


def _tag(r: redis.Redis, hwm: int | None, *reserve: str) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, mapping={"mode": "segment", "pushed_total": "0"})
    if hwm is not None:
        r.hset(K.state, "hwm", str(hwm))
    if reserve:
        r.rpush(K.reserve, *reserve)


def _snapshot(r: redis.Redis) -> dict[object, object]:
    """Every key, serialized: equal before and after a call means nothing written."""
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


def _refused(r: redis.Redis, code: int, call: Callable[[], object]) -> None:
    before = _snapshot(r)
    assert call() == code
    assert _snapshot(r) == before


# -- every refusal, nothing written ---------------------------------------------------------


def test_a_wrong_token_is_refused(r: redis.Redis) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.LOCK_LOST, lambda: _range(r, "101:201", "111:201", 101, 110,
                                                  token=b"other"))
    r.delete(K.lock)  # expired
    _refused(r, scripts.LOCK_LOST, lambda: _range(r, "101:201", "111:201", 101, 110))


def test_a_head_other_than_the_one_read_is_refused(r: redis.Redis) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.HEAD_MOVED, lambda: _range(r, "91:201", "101:201", 91, 100))
    assert _range(r, "101:201", "111:201", 101, 110) == 10
    # the same chunk again (a repeat after a lost reply, or a second refiller): refused
    _refused(r, scripts.HEAD_MOVED, lambda: _range(r, "101:201", "111:201", 101, 110))


def test_a_head_at_or_below_the_high_water_mark_is_refused(r: redis.Redis) -> None:
    """The mark is above the head's start (a reserve left behind by the mark: only this
    check stands between those IDs and a second hand-out)."""
    _tag(r, 150, "101:201")
    _refused(r, scripts.NOT_ABOVE_HWM, lambda: _range(r, "101:201", "111:201", 101, 110))
    r.hset(K.state, "hwm", "101")
    _refused(r, scripts.NOT_ABOVE_HWM, lambda: _range(r, "101:201", "111:201", 101, 110))
    r.hset(K.state, "hwm", "100")
    assert _range(r, "101:201", "111:201", 101, 110) == 10


@pytest.mark.parametrize(
    ("new_head", "first", "last"),
    [("112:201", 102, 111),     # does not start at the head's start
     ("", 101, 201),            # ends at the head's end (half-open: beyond it)
     ("", 101, 300)],           # ends beyond it
    ids=["not-at-start", "at-end", "beyond-end"],
)
def test_ids_outside_the_head_are_refused(
    r: redis.Redis, new_head: str, first: int, last: int
) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.OUTSIDE_HEAD, lambda: _range(r, "101:201", new_head, first, last))


@pytest.mark.parametrize(
    ("head", "first", "last", "now", "hwm"),
    [("101:201", "0101", "110", NOW, "100"),
     ("101:201", "101", "110.0", NOW, "100"),
     ("101:201", "101", "1e2", NOW, "100"),
     ("101:201", "101", "-110", NOW, "100"),
     ("101:201", "101", "110", "1.7e12", "100"),
     ("101:201", "101", "110", "", "100"),
     ("0101:201", "0101", "110", NOW, "100"),
     ("101", "101", "110", NOW, "100"),
     ("101:201", "101", "110", NOW, "-5")],
    ids=["first-leading-zero", "last-fraction", "last-exponent", "last-negative",
         "now-exponent", "now-empty", "head-leading-zero", "head-no-colon", "mark-negative"],
)
def test_values_that_are_not_canonical_decimals_are_refused(
    r: redis.Redis, head: str, first: str, last: str, now: str, hwm: str
) -> None:
    _tag(r, None, head)
    r.hset(K.state, "hwm", hwm)
    _refused(r, scripts.NOT_DECIMAL, lambda: _range(r, head, "111:201", first, last, now=now))


@pytest.mark.parametrize(
    ("new_head", "first", "last", "extra"),
    [("112:201", 101, 110, ()),          # the head after is not last + 1
     ("111:301", 101, 110, ()),          # ... nor ends where the head ends
     ("", 101, 110, ()),                 # "" but the chunk leaves IDs in the range
     ("201:201", 101, 200, ()),          # not "" but the chunk uses the range up
     ("61:201", 101, 60, ()),            # last below first: would lower the mark
     ("111:201", 101, 110, ("x",)),      # a seventh argument
     ("100102:200101", 101, 100101, ())],  # 100,001 IDs: more than a call takes
    ids=["head-after-off-by-one", "head-after-other-end", "empty-head-too-early",
         "head-after-used-up", "last-below-first", "seven-arguments", "too-many-ids"],
)
def test_arguments_that_do_not_agree_are_refused(
    r: redis.Redis, new_head: str, first: int, last: int, extra: tuple[str, ...]
) -> None:
    _tag(r, 100, "101:200101")
    _refused(r, scripts.INCONSISTENT,
             lambda: _range(r, "101:200101", new_head, first, last, *extra))
    assert _range(r, "101:200101", "100101:200101", 101, 100100) == 100_000  # the most


def test_a_missing_argument_is_refused(r: redis.Redis) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.INCONSISTENT, lambda: r.eval(
        scripts.source("push_range"), 4, K.ids, K.reserve, K.state, K.lock,
        TOKEN, "101:201", "111:201", NOW, "101"))


@pytest.mark.parametrize("last", [P53, P53 + 1, 10**16, MAX - 1])
def test_a_last_id_at_or_above_2_53_is_refused_for_push_ids(r: redis.Redis, last: int) -> None:
    first = last - 9
    head = f"{first}:{last + 1}"
    _tag(r, first - 1, head)
    _refused(r, scripts.BEYOND_DOUBLES, lambda: _range(r, head, "", first, last))
    assert _ids(r, head, "", first, last) == 10  # the chunk push_ids takes


# -- the boundaries: canonical decimals, exact -----------------------------------------------


@pytest.mark.parametrize(
    ("first", "last"),
    [(P53 - 1000, P53 - 1),       # up to 2^53 - 1, the last exact double
     (10**15 - 500, 10**15 + 500),  # across 10^15 (tostring: "1e+15")
     (0, 999), (9_999_999_500, 10_000_000_600)],
    ids=["to-2^53-1", "across-10^15", "from-0", "across-10^10"],
)
def test_the_ids_are_written_as_python_writes_them(r: redis.Redis, first: int, last: int) -> None:
    head = f"{first}:{last + 1}"
    _tag(r, None if first == 0 else first - 1, head)
    assert _range(r, head, "", first, last) == last - first + 1
    assert r.lrange(K.ids, 0, -1) == [str(i).encode() for i in range(first, last + 1)]
    assert r.hget(K.state, "hwm") == str(last).encode()
    assert r.hget(K.state, "pushed_total") == str(last - first + 1).encode()
    assert r.llen(K.reserve) == 0


def test_the_pool_pushes_each_chunk_by_the_script_that_writes_it_exactly(
    pool: Pool, r: redis.Redis
) -> None:
    """Below 2^53 by push_range, from 2^53 by push_ids, up to 2^63 - 1: the IDs as Python
    writes them, whichever script ran."""
    for first, count in [(P53 - 5, 5), (P53 - 5, 6), (P53, 10), (10**16 - 500, 1001),
                         (MAX - 9, 9), (MAX - 1, 1)]:
        r.flushdb()
        head = Range(first, first + count + (0 if first + count > MAX else 1))
        _tag(r, first - 1, head.encode())
        calls = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert pool.push("t", TOKEN, head, count, 0) == count
        assert r.lrange(K.ids, 0, -1) == [str(i).encode() for i in range(first, first + count)]
        assert r.hget(K.state, "hwm") == str(first + count - 1).encode()
        assert r.info("commandstats")["cmdstat_evalsha"]["calls"] > calls
        assert pool._push_call(TOKEN, head, count, 0)[0] is (
            pool._push_range if first + count - 1 < RANGE_LIMIT else pool._push)
    assert r.lrange(K.ids, 0, -1) == [str(MAX - 1).encode()]


def test_push_range_writes_what_push_ids_writes(r: redis.Redis) -> None:
    """The same chunks through either script leave the same list, reserve and state."""
    after = []
    for push in (_ids, _range):
        r.flushdb()
        _tag(r, 99, "100:1100", "5000:6000")
        assert push(r, "100:1100", "600:1100", 100, 599) == 500
        assert push(r, "600:1100", "", 600, 1099) == 1000
        assert push(r, "5000:6000", "5001:6000", 5000, 5000) == 1001
        after.append(_snapshot(r))
    assert after[0] == after[1]


# -- the previous release's push_ids and push_range fence each other ------------------------


def test_a_chunk_pushed_by_one_script_is_refused_to_the_other(r: redis.Redis) -> None:
    _tag(r, 100, "101:201", "301:401")
    assert _ids(r, "101:201", "151:201", 101, 150, RELEASED_PUSH_IDS) == 50
    _refused(r, scripts.HEAD_MOVED, lambda: _range(r, "101:201", "151:201", 101, 150))
    assert _range(r, "151:201", "", 151, 200) == 100
    _refused(r, scripts.HEAD_MOVED,
             lambda: _ids(r, "151:201", "", 151, 200, RELEASED_PUSH_IDS))
    r.hset(K.state, "hwm", "310")  # a mark above the head (a stale reserve): both refuse
    _refused(r, scripts.NOT_ABOVE_HWM,
             lambda: _ids(r, "301:401", "311:401", 301, 310, RELEASED_PUSH_IDS))
    _refused(r, scripts.NOT_ABOVE_HWM, lambda: _range(r, "301:401", "311:401", 301, 310))


# -- a run of chunks in one pipeline ----------------------------------------------------------


def test_a_run_crosses_ranges_and_scripts(pool: Pool, r: redis.Redis) -> None:
    _tag(r, 100, "101:201", f"{P53 - 2}:{P53 + 3}")
    chunks = [(Range(101, 201), 60), (Range(161, 201), 40), (Range(P53 - 2, P53 + 3), 5)]
    run = pool.push_run("t", TOKEN, chunks, 0)
    assert (run.landed, run.pushed, run.length, run.code) == (3, 105, 105, 0)
    assert r.lrange(K.ids, 0, -1) == [str(i).encode() for i in
                                      [*range(101, 201), *range(P53 - 2, P53 + 3)]]
    assert r.llen(K.reserve) == 0 and r.hget(K.state, "hwm") == str(P53 + 2).encode()


@pytest.mark.parametrize("refusal", ["hwm", "lock", "head"])
def test_a_refused_chunk_stops_the_run_and_the_fence_refuses_the_rest(
    pool: Pool, r: redis.Redis, refusal: str
) -> None:
    """The second chunk of four is refused: the third and fourth, which expect the head
    the second would have left, are refused by the fence (nothing written after the
    first chunk)."""
    _tag(r, 100, "101:201", "301:401")
    chunks = [(Range(101, 201), 50), (Range(151, 201), 50), (Range(301, 401), 50),
              (Range(351, 401), 50)]
    # the first chunk lands, then something moves under the second
    assert pool.push("t", TOKEN, *chunks[0], 0) == 50
    if refusal == "hwm":
        r.hset(K.state, "hwm", "160")
    elif refusal == "lock":
        r.set(K.lock, b"another")
    else:
        r.lset(K.reserve, 0, "161:201")  # a client took 151..160
        r.hset(K.state, "hwm", "160")
    before = _snapshot(r)
    run = pool.push_run("t", TOKEN, chunks[1:], 0)
    expected = {"hwm": scripts.NOT_ABOVE_HWM, "lock": scripts.LOCK_LOST,
                "head": scripts.HEAD_MOVED}[refusal]
    assert (run.landed, run.pushed, run.code) == (0, 0, expected)
    assert _snapshot(r) == before
    # each later chunk, sent alone, is refused too
    for head, n in chunks[2:]:
        with pytest.raises(StaleWrite) as refused:
            pool.push("t", TOKEN, head, n, 0)
        assert refused.value.code in (scripts.HEAD_MOVED, scripts.LOCK_LOST)
    assert _snapshot(r) == before


def test_a_run_goes_on_after_the_script_cache_was_emptied(pool: Pool, r: redis.Redis) -> None:
    _tag(r, 100, "101:201", f"{P53}:{P53 + 10}")
    r.script_flush()
    run = pool.push_run("t", TOKEN, [(Range(101, 201), 100), (Range(P53, P53 + 10), 10)], 0)
    assert (run.landed, run.pushed, run.length, run.code) == (2, 110, 110, 0)
    assert r.lrange(K.ids, 0, -1) == [str(i).encode() for i in
                                      [*range(101, 201), *range(P53, P53 + 10)]]


def test_a_run_on_a_redis_cluster(topologies: Topologies) -> None:
    """The run's pipeline on a Cluster (redis-py's cluster pipeline refuses its evalsha()
    method: the commands are sent as EVALSHA), also after each master's script cache was
    emptied."""
    cluster = topologies.cluster(3, 0)
    client = connect(load_settings(redis_url=cluster.url, redis_cluster=True,
                                   broker_url="redis://127.0.0.1:1/0"))
    pool = Pool(client)
    pool.register("t", "segment", 0)
    lock = pool.refill_lock("t", 30_000)
    assert lock.acquire()
    pool.append_reserve("t", lock.token, Range(1, 1001))
    pool.append_reserve("t", lock.token, Range(P53, P53 + 100))
    run = pool.push_run("t", lock.token, [(Range(1, 1001), 600), (Range(601, 1001), 300)], 0)
    assert (run.landed, run.pushed, run.length, run.code) == (2, 900, 900, 0)
    for node in client.get_primaries():  # type: ignore[attr-defined]
        node.redis_connection.script_flush()
    run = pool.push_run("t", lock.token, [(Range(901, 1001), 100), (Range(P53, P53 + 100), 100)],
                        0)
    assert (run.landed, run.pushed, run.length, run.code) == (2, 200, 1100, 0)
    assert client.lrange(K.ids, 0, -1) == [
        str(i).encode() for i in [*range(1, 1001), *range(P53, P53 + 100)]]


# -- refillers of both releases and clients on one tag ----------------------------------------

RANGES = 40
SIZE = 997  # IDs a range (odd, so chunks end anywhere)
BASE = 10**15 - 20 * SIZE  # across 10^15


def _old_refiller(url: str, stop: threading.Event, seed: int) -> None:
    """The previous release's refill: its push_ids.lua, chunks of its own sizes from the
    head it reads, refusals ignored (it reads the head again)."""
    rng = random.Random(seed)
    client = redis.Redis.from_url(url)
    push = client.register_script(RELEASED_PUSH_IDS)
    while not stop.is_set():
        raw = client.lindex(K.reserve, 0)
        if raw is None:
            return
        head = Range.decode(raw)
        n = rng.randint(1, min(head.size, 400))
        push(keys=[K.ids, K.reserve, K.state, K.lock],
             args=[TOKEN, head.encode(), head.after_taking(n), 0,
                   *(str(i) for i in range(head.start, head.start + n))])
    client.close()


def _new_refiller(url: str, stop: threading.Event, seed: int) -> None:
    """This release's refill: runs of one to four chunks (push_range) from the reserve it
    reads, in one pipeline each."""
    rng = random.Random(seed)
    client = redis.Redis.from_url(url)
    pool = Pool(client)
    while not stop.is_set():
        reserve = [Range.decode(raw) for raw in client.lrange(K.reserve, 0, 3)]
        if not reserve:
            return
        chunks: list[tuple[Range, int]] = []
        for head in reserve:
            while head.size and len(chunks) < rng.randint(1, 4):
                n = rng.randint(1, min(head.size, 400))
                chunks.append((head, n))
                head = Range(head.start + n, head.end)
        pool.push_run("t", TOKEN, chunks, 0)
    client.close()


def _client(url: str, stop: threading.Event, got: list[int]) -> None:
    """Pops; on an empty list takes from the reserve head (the reserve policy)."""
    client = redis.Redis.from_url(url)
    pool = Pool(client)
    while not stop.is_set():
        popped = client.lpop(K.ids, 37)
        if popped:
            got += [int(i) for i in popped]
            continue
        raw = client.lindex(K.reserve, 0)
        if raw is None:
            if client.llen(K.ids) == 0 and client.llen(K.reserve) == 0:
                return
            continue
        taken = pool.take_reserve("t", Range.decode(raw), 23)
        if isinstance(taken, list):
            got += taken
    client.close()


def test_refillers_of_both_releases_and_clients_hand_out_no_id_twice(
    r: redis.Redis, redis_url: str
) -> None:
    """Two refillers of the previous release (push_ids.lua) and two of this one
    (push_range.lua, pipelined runs) push from one reserve under one token (the worst
    case: the lock fences nothing between them, only the chunk fence does), while three
    clients pop and take from the reserve head whenever the list is empty: every ID of
    the reserve is handed out exactly once."""
    _tag(r, BASE - 1)
    pool = Pool(r)
    for i in range(RANGES):
        pool.append_reserve("t", TOKEN, Range(BASE + i * SIZE, BASE + (i + 1) * SIZE))
    stop = threading.Event()
    got: list[list[int]] = [[], [], []]
    threads = [threading.Thread(target=_old_refiller, args=(redis_url, stop, s))
               for s in (1, 2)]
    threads += [threading.Thread(target=_new_refiller, args=(redis_url, stop, s))
                for s in (3, 4)]
    threads += [threading.Thread(target=_client, args=(redis_url, stop, g)) for g in got]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    try:
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), \
            "the run did not finish in 120 s (IDs lost: the clients wait for them)"
    finally:
        stop.set()
    handed = [i for g in got for i in g]
    assert len(handed) == len(set(handed)), \
        f"{len(handed) - len(set(handed))} IDs handed out twice"
    assert sorted(handed) == list(range(BASE, BASE + RANGES * SIZE))
    for g in got:  # each client's IDs increase
        assert g == sorted(g)
