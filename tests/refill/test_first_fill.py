"""The batched first fill of new segment tags (leafpool.segment.first_fill, docs/design.md
§4): each protocol step one round trip for the batch, every allocation in one database
transaction. Filled exactly as the one-tag refill fills them; no ID twice with a
concurrent one-tag refill, a second batch or another allocation of the same rows; a tag
whose lock is held is skipped, a refused tag fails alone."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.core.errors import LeafpoolError, OutsideDcSlot
from leafpool.housekeeping.sweep import sweep
from leafpool.housekeeping.sync import sync_tags
from leafpool.redis import scripts
from leafpool.redis.pool import Level, Pool, Range
from leafpool.refill.batch import BatchResult, FirstFillDone, refill_many
from leafpool.segment.counter import SLOT_SIZE, DcSlot
from leafpool.segment.first_fill import FirstFill
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.step import StepRule
from leafpool.segment.store import Segment, SegmentStore

WAIT = 60.0
NOW = 1_800_000_000.0  # one wall clock for both paths: their recorded times compare equal
#: state fields that measure this run, not the protocol: the allocation's latency, and
#: when the tag sync registered the tag
TIMED = {"alloc_ms", "last_alloc_ms", "created_ms"}


def _settings(make_settings: Callable[..., Settings], **more: object) -> Settings:
    return make_settings(pool_floor=30, pool_ceiling=30, chunk_size=8, **more)


def _refiller(pool: Pool, store: SegmentStore, settings: Settings) -> SegmentRefiller:
    return SegmentRefiller(pool, store, settings, wall=lambda: NOW)


def _batch(refiller: SegmentRefiller, tags: Sequence[str]) -> BatchResult:
    """The task's call (workers/tasks.py refill_segments); the batched first fill must not
    raise (the batch would fill every tag one by one instead, and pass for it)."""
    first = FirstFill(refiller)
    raised: list[BaseException] = []

    def first_fill(batch: Sequence[str]) -> FirstFillDone:
        try:
            return first.run(batch, clear_queued=True)
        except BaseException as exc:
            raised.append(exc)
            raise

    result = refill_many(lambda tag: refiller.refill(tag, clear_queued=True), tags,
                         threads=4, first_fill=first_fill)
    assert not raised, raised
    return result


def _ids(r: redis.Redis, tag: str) -> list[int]:
    return [int(x) for x in r.lrange(f"leafpool:{{{tag}}}:ids", 0, -1)]


def _held(pool: Pool, tag: str) -> list[int]:
    """Every ID the pool holds for ``tag``: its list and its reserve's ranges."""
    snap = pool.snapshot(tag)
    ids = _ids(pool.redis, tag)
    for rng in snap.reserve:
        ids += range(rng.start, rng.end)
    return ids


def _max_id(store: SegmentStore, tag: str) -> int:
    with store.engine.begin() as conn:
        return int(conn.execute(text("SELECT max_id FROM leaf_alloc WHERE biz_tag = :t"),
                                {"t": tag}).scalar_one())


def test_a_batch_of_new_tags_is_filled_exactly_like_single_refills(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """Step 7 < target 30 < the reserve target: several allocations a tag (rounds of one
    transaction and one pipeline each), chunks of 8; the state, the list, the reserve and
    the counter of each batched tag are the single refill's."""
    batched = [f"b{n:02d}" for n in range(12)]
    single = [f"s{n:02d}" for n in range(12)]
    for tag in (*batched, *single):
        store.add_tag(tag, step=7)
    sync_tags(pool, store)
    refiller = _refiller(pool, store, _settings(make_settings))
    pool.mark_queued_many(batched, 60)

    result = _batch(refiller, batched)
    singles = {tag: refiller.refill(tag) for tag in single}

    assert set(result.refilled) == set(batched) and not result.failed, result.as_dict()
    assert result.pushed == 12 * 30
    for b, s in zip(batched, single, strict=True):
        one, many = pool.snapshot(s), pool.snapshot(b)
        assert {k: v for k, v in many.state.items() if k not in TIMED} == \
            {k: v for k, v in one.state.items() if k not in TIMED}, b
        assert many.hits == one.hits
        assert _ids(r, b) == _ids(r, s) == list(range(1, 31))  # contiguous from the counter
        assert many.reserve == one.reserve and many.reserve[0].start == 31
        assert _max_id(store, b) == _max_id(store, s) == many.floor
        assert int(many.state["allocations"]) > 1 and many.state["refills"] == "1"
        assert result.refilled[b] == singles[s].summary()  # the same segments, from 1
    assert not any(r.exists(pool.tag(tag).queued) for tag in batched)
    assert not any(r.exists(pool.tag(tag).lock) for tag in batched)


def test_no_id_twice_with_a_concurrent_one_tag_refill_of_the_same_tags(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings]
) -> None:
    """A batch and one-tag refills (forced: they allocate whenever they get the lock) of
    the same tags at once: every ID held is held once, below the counter."""
    tags = [f"t{n:02d}" for n in range(30)]
    for tag in tags:
        store.add_tag(tag, step=5)
    sync_tags(pool, store)
    refiller = _refiller(pool, store, _settings(make_settings))
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def batch() -> None:
        start.wait(WAIT)
        _batch(refiller, tags)

    def singles(order: list[str]) -> None:
        start.wait(WAIT)
        for tag in order:
            try:
                refiller.refill(tag, force=True)
            except LeafpoolError as exc:  # a refused write: a gap, reported below
                errors.append(exc)

    threads = [threading.Thread(target=batch),
               threading.Thread(target=singles, args=(tags,)),
               threading.Thread(target=singles, args=(tags[::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    _batch(refiller, tags)  # whatever a lock skipped is filled now
    for tag in tags:
        held = _held(pool, tag)
        assert len(held) == len(set(held)), (tag, sorted(held))
        assert held and max(held) < _max_id(store, tag), tag
        assert _ids(pool.redis, tag)[:1] == [1], tag
    assert not errors, errors


def test_a_tag_whose_lock_is_held_is_skipped(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    for tag in ("a", "b", "c"):
        store.add_tag(tag, step=100)
    sync_tags(pool, store)
    refiller = _refiller(pool, store, _settings(make_settings))
    other = pool.refill_lock("b", 30_000)
    assert other.acquire()
    pool.mark_queued_many(["a", "b", "c"], 60)
    result = _batch(refiller, ["a", "b", "c"])
    assert result.skipped == {"b": "locked"} and set(result.refilled) == {"a", "c"}
    assert _ids(r, "b") == [] and pool.snapshot("b").int("allocations") == 0
    assert _max_id(store, "b") == 1  # nothing allocated for it
    assert r.get(pool.tag("b").lock) == other.token  # still its holder's
    assert not r.exists(pool.tag("b").queued)  # the holder fills it, as a single refill
    other.release()


def test_a_refused_tag_fails_alone_and_the_others_fill(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """Mode own, DC 1: one counter moved into DC 2's slot (OutsideDcSlot: refused, never
    moved), one row deleted (UnknownTag); each writes nothing, the others fill."""
    own = SegmentStore(store.engine, slot=DcSlot(1))
    tags = [f"t{n}" for n in range(6)]
    for tag in tags:
        own.add_tag(tag, step=50)
    sync_tags(pool, own)
    with own.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 't2'"),
                     {"m": 2 * SLOT_SIZE + 5})
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 't4'"))
    refiller = _refiller(pool, own, _settings(make_settings))
    result = _batch(refiller, tags)
    assert set(result.failed) == {"t2"} and "OutsideDcSlot" in result.failed["t2"]
    assert result.skipped == {"t4": "unknown tag"}
    assert set(result.refilled) == {"t0", "t1", "t3", "t5"}
    for tag in ("t0", "t1", "t3", "t5"):
        assert _ids(r, tag) == list(range(SLOT_SIZE + 1, SLOT_SIZE + 31)), tag
    assert _max_id(own, "t2") == 2 * SLOT_SIZE + 5  # nothing written
    for tag in ("t2", "t4"):
        snap = pool.snapshot(tag)
        assert _ids(r, tag) == [] and not snap.reserve, tag
        assert snap.int("refill_failures") == 1 and snap.int("refills") == 0, tag
    assert "DC 2's slot" in pool.snapshot("t2").state["last_error"]


def test_two_batches_of_overlapping_tags_hand_out_no_id_twice(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings]
) -> None:
    tags = [f"t{n:02d}" for n in range(40)]
    for tag in tags:
        store.add_tag(tag, step=9)
    sync_tags(pool, store)
    refiller = _refiller(pool, store, _settings(make_settings))
    start = threading.Barrier(2)
    results: list[BatchResult] = []

    def batch(order: list[str]) -> None:
        start.wait(WAIT)
        results.append(_batch(refiller, order))

    threads = [threading.Thread(target=batch, args=(tags[:30],)),
               threading.Thread(target=batch, args=(tags[10:][::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive(), "a batch did not finish (a deadlock?)"
    assert len(results) == 2 and not any(res.failed for res in results), results
    for tag in tags:
        held = _held(pool, tag)
        assert len(held) == len(set(held)) and max(held) < _max_id(store, tag), tag
        assert _ids(pool.redis, tag) == list(range(1, 31)), tag


@pytest.mark.parametrize("database_url", ["mysql"], indirect=True)
def test_allocations_of_overlapping_tags_in_any_order_never_overlap_nor_deadlock(
    store: SegmentStore,
) -> None:
    """allocate_many from four threads, overlapping sets of rows in opposite orders, and
    one-row allocations among them: every range handed out is disjoint from the others
    (each row advanced once per allocation, under its lock), and no transaction is
    refused as a deadlock."""
    tags = [f"t{n:02d}" for n in range(20)]
    for tag in tags:
        store.add_tag(tag, step=10)
    got: list[Segment] = []
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def many(order: list[str]) -> None:
        start.wait(WAIT)
        for _ in range(15):
            try:
                out = store.allocate_many([(tag, None, 0, False) for tag in order])
            except LeafpoolError as exc:
                errors.append(exc)
                continue
            for seg in out.values():
                assert isinstance(seg, Segment), seg
                got.append(seg)

    def one() -> None:
        start.wait(WAIT)
        for n in range(60):
            got.append(store.allocate(tags[n % len(tags)]))

    threads = [threading.Thread(target=many, args=(tags[:15],)),
               threading.Thread(target=many, args=(tags[5:][::-1],)),
               threading.Thread(target=many, args=(tags[::2],)),
               threading.Thread(target=many, args=(tags[::-3],)),
               threading.Thread(target=one)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert not errors, errors
    for tag in tags:
        mine = sorted((s.start, s.end) for s in got if s.tag == tag)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine)), (tag, mine)
        assert mine[-1][1] == _max_id(store, tag), tag  # nothing skipped, nothing twice


def test_an_outside_dc_slot_refusal_in_allocate_many_is_the_tags_alone(
    store: SegmentStore,
) -> None:
    own = SegmentStore(store.engine, slot=DcSlot(0))
    for tag in ("a", "b"):
        own.add_tag(tag, step=10)
    with own.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 'a'"),
                     {"m": SLOT_SIZE + 3})
    out = own.allocate_many([("b", None, 0, True), ("a", None, 0, True)])
    assert list(out) == ["b", "a"]
    assert isinstance(out["a"], OutsideDcSlot)
    b = out["b"]
    assert isinstance(b, Segment) and Range(b.start, b.end) == Range(1, 11)
    assert _max_id(own, "a") == SLOT_SIZE + 3 and _max_id(own, "b") == 11


def test_a_batched_tag_keeps_its_queued_marker_until_its_state_is_recorded(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The drop watcher reads a tag, then marks it queued: a marker cleared when the
    batch took the locks let a watcher that read the tags due and free just before mark
    and queue each of them again. The marker stays while the batch allocates (seen from
    inside its transaction) and is gone once the tag is filled."""
    tags = [f"t{n}" for n in range(5)]
    for tag in tags:
        store.add_tag(tag, step=100)
    sync_tags(pool, store)
    pool.mark_queued_many(tags, 60)
    seen: list[list[int]] = []

    class Watching(SegmentStore):
        def allocate_many(self, requests: Sequence[tuple[str, StepRule | None, int, bool]]
                          ) -> dict[str, Segment | LeafpoolError]:
            seen.append([int(r.exists(pool.tag(tag).queued)) for tag, _, _, _ in requests])
            return super().allocate_many(requests)

    refiller = _refiller(pool, Watching(store.engine), _settings(make_settings))
    result = _batch(refiller, tags)
    assert set(result.refilled) == set(tags)
    assert seen == [[1] * 5]
    assert not any(r.exists(pool.tag(tag).queued) for tag in tags)


def test_each_batched_tag_is_released_after_its_state_is_recorded_and_its_marker_cleared(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The records, the markers and the releases share one pipeline: Redis runs it in
    order, so each tag's lock goes after its state is recorded and its marker cleared (a
    refill that took the lock in between would find a state not yet recorded, and its
    record overwritten by this one), as the commands Redis ran show (MONITOR)."""
    tags = [f"m{n}" for n in range(6)]
    for tag in tags:
        store.add_tag(tag, step=100)
    sync_tags(pool, store)
    pool.mark_queued_many(tags, 60)
    names = {scripts.sha1(name): name for name in ("record", "lock_release")}
    ran: list[tuple[str, str]] = []  # (what, tag) in the order Redis ran them
    listening = threading.Event()

    def watch() -> None:
        client = redis.Redis(connection_pool=r.connection_pool)
        with client.monitor() as m:  # type: ignore[no-untyped-call]
            listening.set()
            for event in m.listen():
                args = event["command"].split(" ")
                if args[0] == "ECHO":
                    return
                tag = next((a.split("{")[1].split("}")[0] for a in args if "{" in a), "")
                if args[0] == "EVALSHA" and args[1] in names:
                    ran.append((names[args[1]], tag))
                elif args[0] == "DEL" and args[1].endswith(":queued"):
                    ran.append(("cleared", tag))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert listening.wait(WAIT)
    result = _batch(_refiller(pool, store, _settings(make_settings)), tags)
    r.echo("done")
    watcher.join(WAIT)
    assert set(result.refilled) == set(tags)
    for tag in tags:
        order = [what for what, t in ran if t == tag]
        assert order == ["record", "cleared", "lock_release"], (tag, order)


def test_a_sweep_that_read_the_tags_before_a_batch_filled_them_queues_none(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The sweep reads every tag's level, then marks and queues the due ones seconds
    later (over many tags): a batch that filled them in between (and cleared their
    markers) left them due as read, and each was queued a refill with nothing to do. The
    tags marked are read again; the ones no longer due are not queued, their marks
    cleared."""
    tags = [f"w{n}" for n in range(5)]
    for tag in tags:
        store.add_tag(tag, step=100)
    sync_tags(pool, store)
    refiller = _refiller(pool, store, _settings(make_settings))
    real_levels = pool.levels

    def levels_then_fill(names: Sequence[str]) -> list[Level]:
        read = real_levels(names)
        assert set(_batch(refiller, tags).refilled) == set(tags)
        return read

    pool.levels = levels_then_fill  # type: ignore[method-assign,assignment]
    assert all(lv.due() for lv in real_levels(tags))
    assert sweep(pool, 30) == []
    assert not any(r.exists(pool.tag(tag).queued) for tag in tags)


def test_a_batch_after_the_script_cache_was_emptied_loads_the_scripts_and_fills(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The scripts' check shares the locks' pipeline: with the cache empty (a restarted
    Redis) every acquire is refused NOSCRIPT and nothing is taken; the scripts are loaded
    and the pipeline sent again, and every tag is filled by the batch itself."""
    tags = [f"f{n}" for n in range(4)]
    for tag in tags:
        store.add_tag(tag, step=100)
    sync_tags(pool, store)
    r.script_flush()
    result = _batch(_refiller(pool, store, _settings(make_settings)), tags)
    assert set(result.refilled) == set(tags)
    assert all(_ids(r, tag)[:1] == [1] for tag in tags)
    assert not any(r.exists(pool.tag(tag).lock) for tag in tags)
