"""The drop watcher's move of reserve IDs into a tag's list (spill_range.lua below 2^53,
spill_reserve.lua from there, leafpool/redis/spill.py, docs/design.md §3.7) against a
real redis-server: it moves the reserve head's IDs and records them as a refill's push
does; it is refused, writing nothing, while a refill lock exists, once the list holds the
caller's bound, and by the push's own fence; and run against a real refill of the same
tag, concurrently, many times, no ID is handed out twice and the IDs come out strictly
increasing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.core.errors import InvalidArgument, StaleWrite
from leafpool.core.keys import Keys
from leafpool.redis import scripts
from leafpool.redis.pool import Pool, PushRun
from leafpool.redis.pool_common import Range
from leafpool.redis.spill import ReserveSpill, Spilled
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore

K = Keys("leafpool").tag("t")


def _reserve(r: redis.Redis, *ranges: str, hwm: str | None = None) -> None:
    r.rpush(K.reserve, *ranges)
    r.hset(K.state, mapping={"mode": "segment", "pushed_total": 0,
                             **({"hwm": hwm} if hwm else {})})


def _call(r: redis.Redis, *args: str, script: str = "spill_reserve") -> int:
    """``spill_reserve`` takes the IDs as arguments, ``spill_range`` the first and last:
    with two IDs given the arguments are the same."""
    return int(r.eval(scripts.source(script), 4, K.ids, K.reserve, K.state, K.lock, *args))


def _unchanged(r: redis.Redis, reserve: list[bytes], length: int = 0) -> None:
    assert r.lrange(K.reserve, 0, -1) == reserve
    assert r.llen(K.ids) == length


class CountedSpill(ReserveSpill):
    """The real move, counting the calls of each script it sends."""

    def __init__(self, pool: Pool, chunk: int = 1000) -> None:
        super().__init__(pool, chunk)
        self.calls = {"spill_range": 0, "spill_reserve": 0}
        by_range, by_ids = self._range, self._script

        def counted(name: str, script: Any) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return script(*args, **kwargs)
            return call

        self._range = counted("spill_range", by_range)
        self._script = counted("spill_reserve", by_ids)


@pytest.mark.parametrize(("base", "calls"), [
    # IDs below 2^53: generated in Redis from each chunk's two ends (4 chunks: 3, 2, 3, 2)
    (0, {"spill_range": 4, "spill_reserve": 0}),
    # the first range below 2^53, the second from it to 2^53 + 100: two chunks each way
    (2**53 - 200, {"spill_range": 2, "spill_reserve": 2}),
    (2**62, {"spill_range": 0, "spill_reserve": 4}),  # every ID sent
])
def test_a_move_pushes_the_reserve_head_in_chunks_and_records_it(
    pool: Pool, r: redis.Redis, base: int, calls: dict[str, int]
) -> None:
    _reserve(r, f"{base + 100}:{base + 105}", f"{base + 200}:{base + 300}", hwm=str(base + 99))
    spill = CountedSpill(pool, chunk=3)
    done = spill.move("t", 10, below=5, now_ms=1234)
    assert done == Spilled(moved=10, length=10, refused=0)
    assert r.lrange(K.ids, 0, -1) == [str(base + i).encode() for i in (
        *range(100, 105), *range(200, 205))]
    assert r.lrange(K.reserve, 0, -1) == [f"{base + 205}:{base + 300}".encode()]
    state = r.hgetall(K.state)
    assert state[b"hwm"] == str(base + 204).encode() and state[b"pushed_total"] == b"10"
    assert state[b"watch_pushed"] == b"10" and state[b"last_push_ms"] == b"1234"
    assert state[b"reserve_due"] == b"1"  # due until a refill tops the reserve up
    assert spill.calls == calls


def test_a_range_move_writes_canonical_decimals_across_a_power_of_ten(
    pool: Pool, r: redis.Redis
) -> None:
    """``string.format('%d')`` in Lua: no exponent (``tostring`` writes ``1e+15``)."""
    _reserve(r, f"{10**15 - 2}:{10**15 + 5}")
    spill = CountedSpill(pool)
    assert spill.move("t", 5, below=10, now_ms=1).moved == 5
    assert r.lrange(K.ids, 0, -1) == [str(10**15 + i).encode() for i in range(-2, 3)]
    assert spill.calls == {"spill_range": 1, "spill_reserve": 0}


def test_a_range_spill_at_or_above_2_53_is_refused_and_writes_nothing(r: redis.Redis) -> None:
    _reserve(r, f"{2**53 - 1}:{2**53 + 10}")
    assert _call(r, f"{2**53 - 1}:{2**53 + 10}", f"{2**53 + 1}:{2**53 + 10}", "1", "10",
                 str(2**53 - 1), str(2**53), script="spill_range") == scripts.BEYOND_DOUBLES
    _unchanged(r, [f"{2**53 - 1}:{2**53 + 10}".encode()])


def test_a_move_is_refused_while_any_refill_lock_exists(pool: Pool, r: redis.Redis) -> None:
    _reserve(r, "1:1001")
    for value in (b"nonce@" + b"a" * 40, b"another-masters-lock", b"x"):
        r.set(K.lock, value)
        assert ReserveSpill(pool).move("t", 500, below=10, now_ms=1) == \
            Spilled(refused=scripts.LOCK_HELD)
        _unchanged(r, [b"1:1001"])
    r.delete(K.lock)
    assert ReserveSpill(pool).move("t", 500, below=10, now_ms=1).moved == 500


def test_a_move_stops_once_the_list_holds_its_bound(pool: Pool, r: redis.Redis) -> None:
    _reserve(r, "1:1001")
    r.rpush(K.ids, "0")  # hwm unset: a list of one ID (say, a refill filled it meanwhile)
    assert ReserveSpill(pool).move("t", 100, below=1, now_ms=1) == \
        Spilled(refused=scripts.LIST_FILLED)
    _unchanged(r, [b"1:1001"], length=1)
    # the bound grows by what the move pushed before each chunk: pops meanwhile aside,
    # every chunk of one move goes through
    assert ReserveSpill(pool, chunk=10).move("t", 100, below=2, now_ms=1).moved == 100


@pytest.mark.parametrize(("code", "args"), [
    (scripts.HEAD_MOVED, ["1:50", "3:50", "1", "10", "1", "2"]),  # head is 1:100
    (scripts.NOT_ABOVE_HWM, ["1:100", "3:100", "1", "10", "1", "2"]),  # hwm 5 below
    (scripts.INCONSISTENT, ["1:100", "4:100", "1", "10", "1", "2"]),
    (scripts.INCONSISTENT, ["1:100", "3:100", "1", "10", "1", "5"]),
    (scripts.OUTSIDE_HEAD, ["1:100", "3:100", "1", "10", "2", "3"]),
    (scripts.NOT_DECIMAL, ["1:100", "3:100", "01", "10", "1", "2"]),
    (scripts.NOT_DECIMAL, ["1:100", "3:100", "1", "-1", "1", "2"]),
])
@pytest.mark.parametrize("script", ["spill_reserve", "spill_range"])
def test_the_push_fence_refuses_and_writes_nothing(
    r: redis.Redis, code: int, args: list[str], script: str
) -> None:
    hwm = "5" if code == scripts.NOT_ABOVE_HWM else None
    _reserve(r, "1:100", hwm=hwm)
    assert _call(r, *args, script=script) == code
    _unchanged(r, [b"1:100"])


@pytest.mark.parametrize("script", ["spill_reserve", "spill_range"])
def test_a_repeat_of_a_move_that_went_through_is_refused(r: redis.Redis, script: str) -> None:
    _reserve(r, "1:100")
    args = ["1:100", "3:100", "1", "10", "1", "2"]
    assert _call(r, *args, script=script) == 2
    assert _call(r, *args, script=script) == scripts.HEAD_MOVED
    _unchanged(r, [b"3:100"], length=2)


def test_the_chunk_must_be_positive(pool: Pool) -> None:
    with pytest.raises(InvalidArgument, match="chunk=0"):
        ReserveSpill(pool, chunk=0)


def test_the_plan_takes_whole_chunks_across_ranges(pool: Pool) -> None:
    plan = ReserveSpill(pool, chunk=4).plan([Range(1, 7), Range(10, 12)], 9)
    assert plan == [(Range(1, 7), 4), (Range(5, 7), 2), (Range(10, 12), 2)]


class HookedPool(Pool):
    """The real pool, with a hook run before each refill push (where the refill holds
    its lock and has read the reserve): the tests' way to put the watcher's move at a
    chosen point inside a refill."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.before_push: Callable[[], None] | None = None

    def push(self, tag: str, token: bytes, head: Range, count: int, now_ms: int) -> int:
        hook, self.before_push = self.before_push, None  # once per refill
        if hook is not None:
            hook()
        return super().push(tag, token, head, count, now_ms)

    def push_run(self, tag: str, token: bytes, chunks: Sequence[tuple[Range, int]],
                 now_ms: int) -> PushRun:  # the segment refill's pushes
        hook, self.before_push = self.before_push, None
        if hook is not None:
            hook()
        return super().push_run(tag, token, chunks, now_ms)


class HookedSpill(ReserveSpill):
    """The real move, with a hook run between its read of the reserve and its write."""

    def __init__(self, pool: Pool, chunk: int) -> None:
        super().__init__(pool, chunk)
        self.after_read: Callable[[], None] | None = None

    def plan(self, reserve: list[Range], count: int) -> list[tuple[Range, int]]:
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return super().plan(reserve, count)


#: where the move runs against the refill, round after round: before it; while it holds
#: the lock, between its read of the reserve and its push; after its lock was lost
#: (expired) in mid-refill, which then writes on from what it read; a whole refill
#: between the move's read of the reserve and its write; and both started together
ORDERS = ("before", "locked", "lock lost", "refill inside", "together")
ROUNDS = 20  # of each order


def test_a_move_beside_a_running_refill_never_hands_out_an_id_twice(
    r: redis.Redis, sqlite_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The watcher's move and a refill (real lock, real database) of one tag, in every
    order they can meet and started together, round after round, the list drained
    between rounds: every ID popped is new and the pops are strictly increasing."""
    pool = HookedPool(r)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("t", step=300)
    settings = make_settings(database_url=sqlite_url, pool_floor=200, pool_ceiling=200,
                             chunk_size=50, reserve_seconds=1, outage_seconds=0)
    refiller = SegmentRefiller(pool, store, settings)
    refiller.refill("t")
    spill = HookedSpill(pool, chunk=40)
    popped: list[int] = []
    outcomes: dict[str, dict[str, int]] = {order: {} for order in ORDERS}

    def move(order: str) -> None:
        done = spill.move("t", 120, below=10_000, now_ms=1)
        key = "moved" if done.moved else scripts.REFUSALS.get(done.refused, "nothing")
        outcomes[order][key] = outcomes[order].get(key, 0) + 1

    def refill(order: str) -> None:
        try:
            refiller.refill("t", force=True)
        except StaleWrite:  # the refill whose lock was lost: its writes are refused
            assert order == "lock lost"

    try:
        for order in ORDERS * ROUNDS:
            popped += [int(x) for x in r.lpop(K.ids, 10_000) or []]
            if order == "before":
                move(order)
                refill(order)
            elif order == "locked":
                pool.before_push = lambda: move("locked")
                refill(order)
            elif order == "lock lost":
                def expire_then_move() -> None:
                    r.delete(K.lock)  # its TTL ran out; the refill goes on
                    move("lock lost")
                pool.before_push = expire_then_move
                refill(order)
            elif order == "refill inside":
                spill.after_read = lambda: refill("refill inside")
                move(order)
            else:
                start = threading.Barrier(2)

                def together(start: threading.Barrier = start) -> None:
                    start.wait()
                    refill("together")

                thread = threading.Thread(target=together)
                thread.start()
                start.wait()
                move(order)
                thread.join(30)
                assert not thread.is_alive()
    finally:
        store.engine.dispose()
    popped += [int(x) for x in r.lpop(K.ids, 10_000) or []]
    assert len(popped) == len(set(popped)), "an ID was handed out twice"
    assert popped == sorted(popped), "the pool is not strictly increasing"
    print("outcomes of the move:", outcomes)
    # each order met the refill as it says: a refill holding the lock refuses the move;
    # with no lock the move goes through; a head the refill moved after the move read it
    # refuses it
    assert outcomes["before"] == {"moved": ROUNDS}
    assert outcomes["locked"] == {scripts.REFUSALS[scripts.LOCK_HELD]: ROUNDS}
    assert outcomes["lock lost"] == {"moved": ROUNDS}
    assert outcomes["refill inside"] == {scripts.REFUSALS[scripts.HEAD_MOVED]: ROUNDS}
