"""Mode own (``LEAFPOOL_DC_SEGMENTS=own``, docs/design.md §12.3) against MariaDB: each
DC's database keeps a tag's counter in the DC's slot ``[k x 2^50, (k + 1) x 2^50)``.
Two DCs' databases never hand out one ID; a row inserted by hand below the slot is healed
up into it (counted); a counter in another DC's slot and a step past the slot's end are
refused with :class:`OutsideDcSlot` and write nothing; one database shared by mistake by
two DCs hands out no ID twice and stops the DC whose slot it left, loudly. Mode shared and
DC 0 keep single-site behaviour."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.core.errors import CounterBehind, InvalidArgument, OutsideDcSlot
from leafpool.redis.pool import Pool
from leafpool.runtime import Runtime
from leafpool.segment.counter import SLOT_SIZE, DcSlot, own_slot
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.clocks import FakeWallClock

pytestmark = pytest.mark.usefixtures("mariadb_server")


def _fresh(server: services.Server) -> str:
    from tests.conftest import _fresh_database

    return _fresh_database(server)


@pytest.fixture
def dc_stores(mariadb_server: services.Server) -> Iterator[Callable[..., SegmentStore]]:
    """``make(dc_id, url=None)``: DC ``dc_id``'s store in mode own, on a new database (two
    schemas on one MariaDB server stand for two DCs' databases) or on ``url``."""
    made: list[SegmentStore] = []

    def make(dc_id: int, url: str | None = None) -> SegmentStore:
        store = SegmentStore.from_url(url or _fresh(mariadb_server), slot=own_slot("own", dc_id))
        store.init_schema()
        made.append(store)
        return store

    yield make
    for s in made:
        s.engine.dispose()


def _set_max_id(store: SegmentStore, tag: str, max_id: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = :t"),
                     {"m": max_id, "t": tag})


def test_the_slot_is_fixed_and_dc_0_starts_at_0() -> None:
    assert SLOT_SIZE == 2**50
    assert (DcSlot(0).start, DcSlot(0).end, DcSlot(0).first) == (0, 2**50, 1)
    assert (DcSlot(3).start, DcSlot(3).end, DcSlot(3).first) == (3 * 2**50, 4 * 2**50,
                                                                 3 * 2**50 + 1)
    assert DcSlot(7).end <= 2**53  # eight DCs stay exact in JavaScript
    assert DcSlot(1023).end < 2**63
    assert own_slot("shared", 3) is None and own_slot("own", 3) == DcSlot(3)


def test_the_runtime_builds_the_store_with_the_dcs_slot(
        make_settings: Callable[..., Settings]) -> None:
    own = Runtime(make_settings(dc_id=1, dc_count=2, dc_segments="own"))
    shared = Runtime(make_settings(dc_id=1, dc_count=2, dc_segments="shared"))
    assert own.store.slot == DcSlot(1) and shared.store.slot is None


def test_two_dcs_databases_never_hand_out_one_id(
    dc_stores: Callable[..., SegmentStore], r: redis.Redis,
    make_settings: Callable[..., Settings],
) -> None:
    """DC 0 and DC 1, each with its own database and its own pools (two key prefixes on
    one redis-server), refill and pop the same tag: every ID is in its DC's slot and none
    is handed out by both."""
    clock = FakeWallClock()
    popped: dict[int, list[int]] = {}
    firsts: dict[int, int] = {}
    for dc in (0, 1):
        store = dc_stores(dc)
        firsts[dc] = store.add_tag("pay", step=1000).max_id
        prefix = f"dc{dc}"
        settings = make_settings(dc_id=dc, dc_count=2, dc_segments="own", key_prefix=prefix,
                                 pool_floor=2000, pool_ceiling=20_000, pool_seconds=10,
                                 reserve_seconds=10, outage_seconds=0)
        pool = Pool(r, prefix)
        refiller = SegmentRefiller(pool, store, settings, wall=clock)
        got: list[int] = []
        for _ in range(6):
            clock.advance(1.0)
            refiller.refill("pay", force=True)
            got += [int(x) for x in r.lpop(f"{prefix}:{{pay}}:ids", 100_000) or []]
        popped[dc] = got
    both = set(popped[0]) & set(popped[1])
    assert not both, f"{len(both)} IDs handed out by both DCs"
    assert firsts == {0: 1, 1: 2**50 + 1}  # k x 2^50 + the usual start
    for dc, got in popped.items():
        assert len(got) > 5000 and got == sorted(set(got))
        assert all(DcSlot(dc).start < i < DcSlot(dc).end for i in got), dc


def test_a_row_inserted_by_hand_below_the_slot_is_healed_up_into_it_and_counted(
    dc_stores: Callable[..., SegmentStore], r: redis.Redis,
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture,
) -> None:
    """As Leaf users do (``INSERT INTO leaf_alloc ... VALUES ('legacy', 1, 100)``), or a
    database that served DC 0 before: DC 1's first refill moves it to the slot's start."""
    store = dc_stores(1)
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) "
                          "VALUES ('legacy', 4242, 100)"))
    settings = make_settings(dc_id=1, dc_count=2, dc_segments="own", pool_floor=200,
                             pool_seconds=10, reserve_seconds=10, outage_seconds=0)
    pool = Pool(r, "leafpool")
    caplog.set_level(logging.WARNING, logger="leafpool.segment.store")
    SegmentRefiller(pool, store, settings, wall=FakeWallClock()).refill("legacy")
    got = [int(x) for x in r.lpop("leafpool:{legacy}:ids", 100_000) or []]
    assert got[0] == 2**50 + 1 and got == sorted(set(got))
    state = pool.snapshot("legacy").state
    assert state["heals"] == "1" and state["last_heal"] == f"max_id 4242 -> {2**50 + 1}"
    assert any("max_id=4242 was below" in m and "DC 1's slot" in m
               for m in caplog.messages)


def test_under_refuse_a_row_below_the_slot_is_refused_with_the_sql_that_moves_it(
        dc_stores: Callable[..., SegmentStore]) -> None:
    store = dc_stores(2)
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) "
                          "VALUES ('legacy', 1, 100)"))
    with pytest.raises(CounterBehind, match=rf"SET max_id = {2 * 2**50 + 1} "):
        store.allocate("legacy", heal=False)
    assert store.get_tag("legacy").max_id == 1


def test_an_allocation_past_the_slots_end_is_refused_and_writes_nothing(
        dc_stores: Callable[..., SegmentStore]) -> None:
    store = dc_stores(1)
    end = 2 * 2**50
    store.add_tag("pay", step=100)
    _set_max_id(store, "pay", end - 100)  # exactly one step left
    seg = store.allocate("pay", heal=True)
    assert (seg.start, seg.end) == (end - 100, end)
    with pytest.raises(OutsideDcSlot) as caught:
        store.allocate("pay", floor=end, heal=True)
    err = caught.value
    assert (err.tag, err.dc_id, err.slot_start, err.slot_end, err.max_id) == \
        ("pay", 1, 2**50, end, end)
    assert str(err).startswith(f"pay: DC 1's slot is [{2**50}, {end}) and "
                               f"leaf_alloc.max_id={end}: a step of 100 from {end} would "
                               "pass the slot's end (0 IDs left")
    _set_max_id(store, "pay", end - 50)  # half a step left: not handed out either
    with pytest.raises(OutsideDcSlot, match="50 IDs left in the slot"):
        store.allocate("pay", floor=end - 50, heal=True)
    assert store.get_tag("pay").max_id == end - 50


@pytest.mark.parametrize(("dc", "counter", "owner"), [
    (0, 2**50 + 7, 1),       # DC 0 on DC 1's database
    (2, 2**50 + 7, 1),       # DC 2 on DC 1's database: below its slot, not DC 0's
    (1, 3 * 2**50 + 7, 3),   # DC 1 on DC 3's database
])
def test_a_counter_in_another_dcs_slot_is_refused_never_moved(
        dc_stores: Callable[..., SegmentStore], dc: int, counter: int, owner: int) -> None:
    store = dc_stores(dc)
    store.add_tag("pay", step=100)
    _set_max_id(store, "pay", counter)
    with pytest.raises(OutsideDcSlot, match=rf"the counter is in DC {owner}'s slot"):
        store.allocate("pay", heal=True)
    assert store.get_tag("pay").max_id == counter


def test_one_database_shared_by_mistake_hands_out_no_id_twice_and_stops_loudly(
        dc_stores: Callable[..., SegmentStore], mariadb_server: services.Server) -> None:
    """DC 1 pointed at DC 0's database: DC 1's heal moves the one counter into DC 1's
    slot (one counter, one transaction each: still no ID twice); DC 0's next allocation
    finds its counter in DC 1's slot and refuses, naming it, instead of going on there."""
    url = _fresh(mariadb_server)
    dc0 = dc_stores(0, url)
    dc1 = dc_stores(1, url)
    dc0.add_tag("pay", step=100)
    ranges = [dc0.allocate("pay", heal=True), dc1.allocate("pay", heal=True)]
    assert ranges[1].healed_from == 101 and ranges[1].start == 2**50 + 1
    with pytest.raises(OutsideDcSlot, match=r"DC 0's slot .* the counter is in DC 1's slot"):
        dc0.allocate("pay", floor=ranges[0].end, heal=True)
    ranges.append(dc1.allocate("pay", floor=ranges[1].end, heal=True))
    ids = [i for seg in ranges for i in range(seg.start, seg.end)]
    assert len(ids) == len(set(ids))


def test_tag_add_starts_in_the_slot_and_refuses_a_start_outside_it(
        dc_stores: Callable[..., SegmentStore]) -> None:
    store = dc_stores(1)
    with pytest.raises(InvalidArgument, match=rf"start=5 .*at least {2**50 + 1}: DC 1's "
                                              r"slot \[\d+, \d+\) starts there"):
        store.add_tag("pay", step=100, start=5)
    with pytest.raises(InvalidArgument, match=rf"at most {2 * 2**50 - 100} so one step"):
        store.add_tag("pay", step=100, start=2 * 2**50 - 99)
    assert store.add_tag("pay", step=100, start=2**50 + 500).max_id == 2**50 + 500
    assert store.add_tag("other", step=100).max_id == 2**50 + 1


def test_dc_0_in_mode_own_and_mode_shared_are_single_site_unchanged(
        dc_stores: Callable[..., SegmentStore], mysql_url: str) -> None:
    """DC 0's slot starts at 0: a single site's tags and counters are DC 0's as they are.
    Mode shared (no slot) allocates from the counter whatever the DC."""
    own0 = dc_stores(0)
    shared = SegmentStore.from_url(mysql_url)
    shared.init_schema()
    for store in (own0, shared):
        assert store.add_tag("pay", step=10).max_id == 1
        segs = [store.allocate("pay", heal=True) for _ in range(3)]
        assert [(s.start, s.end, s.healed_from) for s in segs] == \
            [(1, 11, None), (11, 21, None), (21, 31, None)]
    shared.engine.dispose()
