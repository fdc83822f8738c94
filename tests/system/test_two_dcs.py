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
from leafpool.core.errors import PoolEmpty
from leafpool.segment.store import SegmentStore
from leafpool.status import notices, pool_status
from tests.support import services
from tests.support.latency_proxy import LatencyProxy
from tests.support.own_mariadb import fresh_database, own_mariadb_fixture
from tests.support.two_dcs import Dc, shared_ids, wait_for, with_port

pytestmark = pytest.mark.slow

TAG = "order"
RATE = 200  # IDs/s each DC's clients take
WAN_MS = 50  # each way
RECOVERY_SECONDS = 2.0
#: small budgets, so that a cut outlives them in seconds: the list holds POOL_SECONDS of
#: the rate, the reserve OUTAGE_SECONDS of the recent peak (RESERVE_SECONDS below it)
OUTAGE_SECONDS = 10.0
SIZING = {"pool_seconds": 3, "outage_seconds": OUTAGE_SECONDS, "reserve_seconds": 1}

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


def _add_tag(url: str, step: int = 1000) -> None:
    store = SegmentStore.from_url(url)
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
            with pytest.raises(PoolEmpty, match=f"{TAG}: pool empty"):
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
        back = time.monotonic()
        wait_for(lambda: pb.first_served_after(back) is not None, 30,
                 "DC b served after the link came back", lambda: _report(b))
        took = (pb.first_served_after(back) or 0.0) - back
        print(f"DC b served again {took:.2f} s after the link came back")
        assert took < RECOVERY_SECONDS
        wait_for(lambda: not b.state(TAG).get("db_unreachable_ms"), 10,
                 "DC b's 'database unreachable' mark cleared", lambda: _report(b))
        _checked(dcs)
    except BaseException:
        print(_report(a, b))
        raise
