"""Two data centers on loopback (issue 31 item 3; docs/design.md §12): in each DC a
redis-server, ``celery -A workers worker -B`` with the DC's ``LEAFPOOL_DC_ID`` and
``LEAFPOOL_DC_COUNT=2``, and clients popping with a plain ``LPOP`` that record every ID.
DC b reaches what lies across the WAN through a latency proxy (50 ms each way) that can
cut the link.

- Mode shared (a): one MariaDB, DC a beside it, DC b through the proxy. No ID handed out
  in both DCs; each DC's pool hands out increasing IDs (G2, per pool); cut off, DC b serves
  its outage budget (``LEAFPOOL_OUTAGE_SECONDS``, small here) at its rate, then its list is
  empty and its status says the database is unreachable since when; the link back, it
  serves again within 2 s.
- Mode own (b): a database per DC; the proxy stays on the WAN link (DC b to DC a's
  database), which DC b does not use: cut for longer than its budget, DC b serves
  throughout from its own database, and no ID is handed out in both DCs.
- Snowflake: each DC's worker leases from a registry of its own; the worker IDs fall in
  the DC's range and no ID is handed out in both DCs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.core.errors import PoolEmptyDatabaseUnreachable
from leafpool.core.snowflake_layout import MAX_WORKER_ID, decode
from leafpool.segment.counter import DcSlot, own_slot
from leafpool.segment.store import SegmentStore
from leafpool.status import notices, pool_status
from tests.support import services
from tests.support.latency_proxy import LatencyProxy
from tests.support.own_mariadb import fresh_database, own_mariadb_fixture
from tests.support.two_dcs import Dc, allocations_after, shared_ids, wait_for, with_port

pytestmark = pytest.mark.slow

TAG = "order"
RATE = 200  # IDs/s each DC's clients take
WAN_MS = 50  # each way
RECOVERY_SECONDS = 2.0
#: small budgets, so that a cut outlives them in seconds: the list holds POOL_SECONDS of
#: the rate, the reserve OUTAGE_SECONDS of the recent peak (RESERVE_SECONDS below it)
#: plus at most a step (MAX_STEP). The low-water mark at 90 % keeps over 5 s of demand in
#: the list when a refill from the reserve is due: more than the 3 s for which a failed
#: refill holds the triggers off (docs/design.md §3.8), as the shipped 30 s x 0.5 does
OUTAGE_SECONDS = 6.0
SIZING = {"pool_seconds": 6, "low_water_ratio": 0.9, "outage_seconds": OUTAGE_SECONDS,
          "reserve_seconds": 1, "max_step": 1000}

own_mariadb = own_mariadb_fixture()


@pytest.fixture
def proxies() -> Iterator[list[LatencyProxy]]:
    made: list[LatencyProxy] = []
    yield made
    for p in made:
        p.stop()


@pytest.fixture
def dcs() -> Iterator[list[Dc]]:
    made: list[Dc] = []
    try:
        yield made
    finally:
        for dc in made:
            dc.stop()


def _add_tag(url: str, step: int = 1000, slot: DcSlot | None = None) -> None:
    store = SegmentStore.from_url(url, slot=slot)
    try:
        store.init_schema()
        store.add_tag(TAG, step=step)
    finally:
        store.engine.dispose()


def _report(*dcs: Dc) -> str:
    return "\n".join([dc.describe(TAG) for dc in dcs] + [dc.log_tail() for dc in dcs])


def _checked(dcs: list[Dc]) -> None:
    """0 IDs handed out in both DCs (or twice in one), each DC's pool in order."""
    for dc in dcs:
        dc.stop_clients()
    extra, examples = shared_ids(*(dc.ids(TAG) for dc in dcs))
    assert extra == 0, f"{extra} IDs handed out more than once over the DCs, e.g. {examples}"
    for dc in dcs:
        bad, examples_ = dc.inversions(TAG)
        assert bad == 0, f"DC {dc.name}: {bad} calls got IDs out of order (G2): {examples_}"


def test_shared_database_dc_b_rides_a_cut_for_its_budget_and_recovers(
        own_mariadb: services.Server, tmp_path: Path, dcs: list[Dc],
        proxies: list[LatencyProxy]) -> None:
    url = fresh_database(own_mariadb)
    _add_tag(url)
    wan = LatencyProxy(own_mariadb.port, delay_ms=WAN_MS).open()
    proxies.append(wan)
    a = Dc("a", 0, 2, url, tmp_path, dict(SIZING)).start()
    dcs.append(a)
    b = Dc("b", 1, 2, with_port(url, wan.port), tmp_path, dict(SIZING)).start()
    dcs.append(b)
    try:
        for dc in (a, b):
            dc.wait_filled(TAG, 100, 90)
        (pa,) = a.pop(TAG, RATE)
        (pb,) = b.pop(TAG, RATE)
        # the product's promise, reached at the rate: the reserve holds the outage budget
        budget = OUTAGE_SECONDS * RATE
        wait_for(lambda: b.snapshot(TAG).reserve_size >= budget, 60,
                 f"DC b's reserve holds {OUTAGE_SECONDS:g} s at {RATE} IDs/s",
                 lambda: _report(b))
        snap = b.snapshot(TAG)
        held = snap.length + snap.reserve_size

        wan.cut()
        cut = time.monotonic()
        # served from list + reserve, then dry: bounded by what it held, with room
        wait_for(lambda: pb.first_empty_after(cut) is not None, held / RATE * 2 + 30,
                 "DC b's list empty after the cut", lambda: _report(b))
        dry = pb.first_empty_after(cut)
        assert dry is not None
        served = dry - cut
        at_dry = b.describe(TAG)
        print(f"\nDC b held {held:,} IDs at the cut ({snap.length:,} list, "
              f"{snap.reserve_size:,} reserve) and served {served:.1f} s at {RATE} IDs/s")
        assert served >= OUTAGE_SECONDS, (
            f"DC b served {served:.1f} s of a {OUTAGE_SECONDS:g} s budget; it held "
            f"{held:,} IDs at the cut; at its first empty pop: {at_dry}")
        # the clear error: a client finds the pool empty; status says since when the
        # database has been unreachable
        settings = load_settings(redis_url=b.redis_url)
        client = Client(settings=settings, policy="raise")
        try:
            wait_for(lambda: not b.r.llen(b.key(TAG)), 5, "DC b's list at 0")  # type: ignore[union-attr]
            with pytest.raises(PoolEmptyDatabaseUnreachable,
                               match=f"{TAG}: pool empty: the database has been unreachable "
                                     "since"):
                client.next_id(TAG)
        finally:
            client.close()
        assert b.pool is not None
        said = notices(pool_status(b.pool, [TAG]))
        assert any(n.startswith("database unreachable since") and TAG in n for n in said), said
        # DC a, beside the database, served throughout
        pause = pa.longest_pause(cut, time.monotonic())
        assert pause < 2.0, f"DC a paused {pause:.1f} s while DC b's link was cut"

        wan.restore()
        back, back_wall = time.monotonic(), time.time()
        wait_for(lambda: pb.first_served_after(back) is not None, 30,
                 "DC b served after the link came back", lambda: _report(b))
        took = (pb.first_served_after(back) or 0.0) - back
        # the refill that ends the outage allocates across the WAN: ~7 round trips of
        # 100 ms here (connection, row lock, guard, advance, commit) that no retry
        # schedule can save; the retry must start it within 2 s of the link's return
        allocations = allocations_after(b.log, TAG, back_wall - 1)
        assert allocations, f"no allocation logged since the link came back\n{_report(b)}"
        started, alloc_s = allocations[0]
        print(f"DC b served again {took:.2f} s after the link came back (its first "
              f"allocation started {started - back_wall:.2f} s after and took "
              f"{alloc_s:.2f} s)")
        assert started - back_wall < RECOVERY_SECONDS, (
            f"the first allocation started {started - back_wall:.2f} s after the link's return")
        assert took < RECOVERY_SECONDS + alloc_s, (
            f"DC b served again {took:.2f} s after the link's return, its allocation "
            f"taking {alloc_s:.2f} s of it")
        wait_for(lambda: not b.state(TAG).get("db_unreachable_ms"), 10,
                 "DC b's 'database unreachable' mark cleared", lambda: _report(b))
        _checked(dcs)
    except BaseException:
        print(_report(a, b))
        raise


CUT_SECONDS = 25.0  # longer than DC b's budget: list + reserve, at most ~20 s at RATE


def test_own_databases_dc_b_serves_through_a_cut_of_any_length(
        own_mariadb: services.Server, tmp_path: Path, dcs: list[Dc],
        proxies: list[LatencyProxy]) -> None:
    """Mode own: each DC allocates from a database of its own, a tag's counter in DC k's
    slot. What crosses the WAN is only what one DC could ask of the other's database:
    the proxy sits there (DC b to DC a's database), and DC b never dials it."""
    url_a, url_b = fresh_database(own_mariadb), fresh_database(own_mariadb)
    _add_tag(url_a, slot=own_slot("own", 0))
    _add_tag(url_b, slot=own_slot("own", 1))
    wan = LatencyProxy(own_mariadb.port, delay_ms=WAN_MS).open()  # DC b -> DC a's database
    proxies.append(wan)
    own = {**SIZING, "dc_segments": "own"}
    a = Dc("a", 0, 2, url_a, tmp_path, dict(own)).start()
    dcs.append(a)
    b = Dc("b", 1, 2, url_b, tmp_path, dict(own)).start()
    dcs.append(b)
    try:
        for dc in (a, b):
            dc.wait_filled(TAG, 100, 90)
        (pa,) = a.pop(TAG, RATE)
        (pb,) = b.pop(TAG, RATE)
        # the same budget as in mode shared: a cut longer than it shows where DC b's IDs
        # come from, not that its reserve was large
        wait_for(lambda: b.snapshot(TAG).reserve_size >= OUTAGE_SECONDS * RATE, 60,
                 f"DC b's reserve holds {OUTAGE_SECONDS:g} s at {RATE} IDs/s",
                 lambda: _report(b))
        snap = b.snapshot(TAG)
        held_s = (snap.length + snap.reserve_size) / RATE

        assert held_s < CUT_SECONDS, f"DC b holds {held_s:.1f} s: the cut would prove nothing"
        wan.cut()
        cut = time.monotonic()
        wait_for(lambda: time.monotonic() - cut >= CUT_SECONDS, CUT_SECONDS + 5,
                 f"{CUT_SECONDS:g} s of cut link", interval=0.2)
        end = time.monotonic()
        wan.restore()
        pause = pb.longest_pause(cut, end)
        print(f"\nDC b held {held_s:.1f} s at {RATE} IDs/s at the cut; through "
              f"{CUT_SECONDS:g} s of cut link its longest pause was {pause:.2f} s")
        assert pause < 2.0, (f"DC b paused {pause:.1f} s while the WAN was cut (it held "
                             f"{held_s:.1f} s at the cut)\n{_report(b)}")
        assert wan.accepted == 0, f"DC b dialed across the WAN {wan.accepted} times"
        pause_a = pa.longest_pause(cut, end)
        assert pause_a < 2.0, f"DC a paused {pause_a:.1f} s"
        back = time.monotonic()
        wait_for(lambda: pb.first_served_after(back) is not None, RECOVERY_SECONDS,
                 "DC b served after the link came back", lambda: _report(b))
        _checked(dcs)
        for dc, slot in ((a, DcSlot(0)), (b, DcSlot(1))):
            outside = [i for i in dc.ids(TAG) if not slot.start < i < slot.end]
            assert not outside, (f"DC {dc.name} handed out IDs outside its slot "
                                 f"[{slot.start}, {slot.end}): {outside[:5]}")
    except BaseException:
        print(_report(a, b))
        raise


# -- snowflake: a registry per DC ----------------------------------------------------------

FLAKE = "flake"
FLAKE_RATE = 500


def _wait_served(dc: Dc, ids: int) -> None:
    wait_for(lambda: len(dc.ids(FLAKE)) >= ids, 60,
             f"DC {dc.name}: {ids:,} IDs handed out at the clients' pace",
             lambda: dc.describe(FLAKE))


def test_snowflake_dcs_with_registries_of_their_own_never_share_a_worker_id(
        own_mariadb: services.Server, tmp_path: Path, dcs: list[Dc]) -> None:
    """Mode mysql, each DC's registry a database of its own (nothing shared: the case
    where only the ranges keep the DCs apart); the same registry name in both."""
    per_dc = MAX_WORKER_ID // 2 + 1  # 1024 / DC_COUNT
    for name, dc_id in (("a", 0), ("b", 1)):
        url = fresh_database(own_mariadb)
        store = SegmentStore.from_url(url)
        try:
            store.init_schema()
            store.add_snowflake_tag(FLAKE)
        finally:
            store.engine.dispose()
        dcs.append(Dc(name, dc_id, 2, url, tmp_path, {
            "snowflake_mode": "mysql", "snowflake_name": "ids",
            "snowflake_cache_dir": str(tmp_path / f"cache-{name}"),
            "pool_seconds": 3}).start())
    a, b = dcs
    try:
        for dc in dcs:
            dc.wait_filled(FLAKE, 100, 90)
            dc.pop(FLAKE, FLAKE_RATE)
        # both DCs generating at once, for several refills each
        for dc in dcs:
            _wait_served(dc, 4 * FLAKE_RATE)
        for dc in dcs:
            dc.stop_clients()
        extra, examples = shared_ids(a.ids(FLAKE), b.ids(FLAKE))
        assert extra == 0, f"{extra} IDs handed out in both DCs (or twice), e.g. {examples}"
        leased = {dc.name: {decode(i).worker_id for i in dc.ids(FLAKE)} for dc in dcs}
        both = leased["a"] & leased["b"]
        assert not both, f"worker IDs {sorted(both)} generated in both DCs"
        for dc in dcs:
            assert dc.ids(FLAKE), f"DC {dc.name} handed out nothing"
            workers = leased[dc.name]
            allowed = range(dc.dc_id * per_dc, (dc.dc_id + 1) * per_dc)
            outside = sorted(w for w in workers if w not in allowed)
            assert not outside, (f"DC {dc.name} (LEAFPOOL_DC_ID={dc.dc_id}) generated with "
                                 f"worker IDs {outside}, outside its range [{allowed.start}, "
                                 f"{allowed.stop})")
            print(f"\nDC {dc.name}: {len(dc.ids(FLAKE)):,} IDs, worker IDs {sorted(workers)}")
    except BaseException:
        print("\n".join([dc.describe(FLAKE) for dc in dcs] + [dc.log_tail() for dc in dcs]))
        raise
