"""``leafpool snowflake layout`` (leafpool/snowflake/registry/layout_admin.py; issue 31 item 1,
docs/design.md §12.1): a registry that served one site grows to DC 0 of 2, against the
real sources (ZooKeeper, MariaDB, a cache directory):

- a registry holding worker IDs 0..2 (1..3 in mode mysql) is shown with each ID's DC
  under the recorded and the configured layout; ``--set`` records DC 0 of 2; a worker of
  DC 0 of 2 then starts and leases in 0..511; a worker of the old settings is refused at
  its (re)start, while one still running keeps its lease;
- a registry holding (or possibly still using) a worker ID in 512..1023 is refused,
  naming it, and is left as it was; in mode zk a forever node counts whatever its
  process does (its sequence is its identity's worker ID for ever);
- a claim of the old layout that passed its layout check before ``--set`` and claims
  after it is refused: a worker ID outside the new range never slips through.

Against the unsafe variants the refusal test fails (``Report.outside`` returning nothing:
``--set`` records DC 0 of 2 over worker 700), and so does the concurrent claim (without
the claim's second look at the record: the old worker takes 700 after ``--set``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from leafpool.core.errors import ConfigurationError
from leafpool.core.snowflake_layout import dc_range
from leafpool.snowflake.registry import layout_admin
from leafpool.snowflake.registry.cache import CacheRecord
from tests.snowflake.registry.test_dc import Site
from tests.support.zk_helpers import raw_client, unique_name

pytestmark = pytest.mark.timeout(240)
OUTSIDE = 700  # a worker ID of DC 1 of 2


@pytest.fixture
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    made = Site(request.param, request, tmp_path, 0, unique_name())
    try:
        yield made
    finally:
        made.close()


def _layout(site: Site) -> tuple[int, int] | None:
    record = site.record()
    return None if record is None else (record["dc_id"], record["dc_count"])


def _hold_outside(site: Site) -> Any:
    """A registry of the old layout (DC 0 of 1) holding worker 700, or (mode zk) a
    forever node whose sequence is 700, its process gone."""
    if site.mode == "zk":
        with raw_client(site.hosts) as client:
            client.create(f"/snowflake/{site.name}/forever/gone-host:w:0-{OUTSIDE:010d}",
                          b'{"timestamp": 0}', makepath=True)
        return None
    if site.mode == "mysql":
        _fill_rows(site, OUTSIDE)  # 1..699 leased by live processes
    reg = _old_claimant(site)
    assert reg.claim().worker_id == OUTSIDE
    return reg


def _old_claimant(site: Site) -> Any:
    """A process of DC 0 of 1 whose claim takes worker 700."""
    more: dict[str, object] = {}
    if site.mode == "local":
        more = {"snowflake_local_map": f"old-host:w:0={OUTSIDE}"}
    if site.mode == "k8s":
        more = {"snowflake_worker_offset": OUTSIDE}
    reg = site.open("old-host:w:0", 0, 1, index=0, more=more)
    if site.mode == "zk_recycle":  # its worker ID before: a claim tries it first
        reg.cache.write(CacheRecord(worker_id=OUTSIDE, last_timestamp=0,
                                    identity="old-host:w:0", mode="zk_recycle"))
    return reg


def _fill_rows(site: Site, upto: int) -> None:
    """Rows 1..upto-1 of leaf_workerid_alloc (where free): up to 511 leased by live
    processes (renewed now), from 512 released (not in use, and not free: a claim takes
    an ID without a row first, so the next is ``upto``)."""
    engine = create_engine(site.url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT IGNORE INTO leaf_workerid_alloc (id, ip, port, ip_port, max_timestamp, "
            "create_time, update_time) VALUES (:id, 'h', 't', :who, 0, NOW(), "
            "IF(:id < 512, NOW(), NULL))"),
            [{"id": i, "who": f"filler-{i}:w:0"} for i in range(1, upto)])
    engine.dispose()


@pytest.mark.parametrize("site", ["zk", "zk_recycle", "k8s", "mysql", "local"], indirect=True)
@pytest.mark.parametrize("unrecorded", [False, True], ids=["recorded", "before the record"])
def test_a_site_of_one_dc_grows_to_dc_0_of_2(site: Site, unrecorded: bool) -> None:
    old = [site.open(f"host-{i}:w:0", 0, 1, index=i) for i in range(3)]
    ids = sorted(reg.claim().worker_id for reg in old)
    assert ids == ([1, 2, 3] if site.mode == "mysql" else [0, 1, 2])
    if unrecorded:  # the previous release's registry: worker IDs, no record
        site.forget_record()
    shown = layout_admin.inspect(site.settings(0, 2))
    assert shown.recorded == (None if unrecorded else (0, 1)) and shown.serves == (0, 1)
    assert [h.worker_id for h in shown.held if h.in_use] == ids and not shown.outside()
    assert _layout(site) == (None if unrecorded else (0, 1))  # showing writes nothing

    done = layout_admin.set_layout(site.settings(0, 2))
    assert done.written and _layout(site) == (0, 2)
    assert not layout_admin.set_layout(site.settings(0, 2)).written  # once is enough

    new = site.open("new-host:w:0", 0, 2, index=3).claim().worker_id
    assert new in dc_range(0, 2) and new not in ids
    for reg in old:  # still running on the old settings: it keeps its lease ...
        reg.check()
        if reg.leased:
            reg.tick()
            reg.check()
    old[0].release()  # ... until it restarts
    with pytest.raises(ConfigurationError) as refused:
        site.open("host-0:w:0", 0, 1).claim()
    assert refused.value.field == "LEAFPOOL_DC_COUNT"
    assert "serves DC 0 of 2 (worker IDs 0..511)" in str(refused.value)


@pytest.mark.parametrize("site", ["zk", "zk_recycle", "k8s", "mysql", "local"], indirect=True)
def test_set_is_refused_naming_a_worker_id_held_outside_the_new_range(site: Site) -> None:
    site.claim("host-a:w:0", 0, 1, index=1)  # the record: DC 0 of 1
    held = _hold_outside(site)
    with pytest.raises(ConfigurationError) as refused:
        layout_admin.set_layout(site.settings(0, 2))
    message = str(refused.value)
    assert refused.value.field == "LEAFPOOL_DC_COUNT" and refused.value.value == 2
    assert f"worker {OUTSIDE}" in message and "outside DC 0 of 2 (worker IDs 0..511)" in message
    assert "left as it was, serving DC 0 of 1" in message
    assert _layout(site) == (0, 1)  # as it was, not half-way
    if held is not None:
        held.check()  # the holder goes on
        held.release()
    if site.mode == "zk":  # a forever node stays a worker ID whether its process runs
        with pytest.raises(ConfigurationError, match=f"worker {OUTSIDE}"):
            layout_admin.set_layout(site.settings(0, 2))
    assert site.claim("host-b:w:0", 0, 1, index=2) in dc_range(0, 1)


@pytest.mark.parametrize("site", ["zk_recycle", "k8s", "mysql", "local"], indirect=True)
def test_a_claim_of_the_old_layout_racing_set_does_not_slip_through(site: Site) -> None:
    """Deterministic: the old worker's claim stops right after its layout check (DC 0 of 1
    recorded: it passes), ``--set`` runs to the end meanwhile (worker 700 is not held
    yet: it records DC 0 of 2), then the claim goes on to take worker 700. It is refused:
    ZooKeeper and local read the record again once the lease or lock exists, mysql
    share-locks it in the claim's transaction. (The other order, the claim's lease made
    before ``--set`` reads the holders, is the refusal above: ``--set`` writes a
    "changing" record before it reads them, and mysql's ``--set`` waits for the claim's
    share lock, then reads its row.)"""
    site.claim("host-a:w:0", 0, 1, index=1)
    if site.mode == "mysql":
        _fill_rows(site, OUTSIDE)
    old = _old_claimant(site)
    checked, go = threading.Event(), threading.Event()
    original: Callable[..., None] = old._check_layout
    calls: list[int] = []

    def paused(*args: Any) -> None:
        original(*args)
        calls.append(1)
        if len(calls) == 1:
            checked.set()
            assert go.wait(60)

    old._check_layout = paused
    outcome: list[object] = []

    def claim() -> None:
        try:
            outcome.append(old.claim().worker_id)
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=claim)
    thread.start()
    assert checked.wait(60)
    assert layout_admin.set_layout(site.settings(0, 2)).written
    go.set()
    thread.join(60)
    assert len(outcome) == 1
    assert isinstance(outcome[0], ConfigurationError), (
        f"the old layout's claim took worker {outcome[0]} after --set recorded DC 0 of 2")
    assert "serves DC 0 of 2" in str(outcome[0])
    assert _layout(site) == (0, 2)
    held = [h.worker_id for h in layout_admin.inspect(site.settings(0, 2)).held if h.in_use]
    assert OUTSIDE not in held, held


@pytest.mark.parametrize("site", ["k8s"], indirect=True)
def test_a_cluster_separated_by_offset_512_records_dc_1_of_2_and_keeps_its_worker_ids(
    site: Site
) -> None:
    """docs/how-to/multiple-dcs.md: a Kubernetes cluster that took 512.. by
    ``LEAFPOOL_SNOWFLAKE_WORKER_OFFSET=512`` as one DC records DC 1 of 2; its pods then
    run with offset 0 and lease the same worker IDs (DC 1's first ID + the index)."""
    old = site.open("pod-0:w:0", 0, 1, index=0, more={"snowflake_worker_offset": 512})
    assert old.claim().worker_id == 512
    assert layout_admin.set_layout(site.settings(1, 2)).written
    assert _layout(site) == (1, 2)
    old.release()  # the rollout restarts the pod with the new settings
    assert site.claim("pod-0:w:0", 1, 2, index=0) == 512


@pytest.mark.parametrize("site", ["zk"], indirect=True)
def test_mode_zk_shows_how_many_new_identities_fit_the_new_range(site: Site) -> None:
    """The forever nodes all lie in 0..511, but ZooKeeper's sequence is never reused: the
    command says how many new identities still fit in the configured range."""
    site.claim("host-a:w:0", 0, 1)
    site.claim("host-b:w:0", 0, 1)
    notes = layout_admin.set_layout(site.settings(0, 2)).notes
    assert len(notes) == 1 and "next sequence" in notes[0]
    assert "510 more new identities fit in DC 0 of 2 (worker IDs 0..511)" in notes[0]
