"""The worker-ID registry contract (leafpool/snowflake/registry/base.py), one set of behaviours run
against every mode that it applies to: local, zk, zk_recycle and mysql, on a real
ZooKeeper and MariaDB (tests/support/registries.py opens them). What only one mode does is in
tests/test_registry_<mode>.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leafpool.core.errors import (
    BackendUnavailable,
    ClockMovedBackwards,
    ConfigurationError,
    InvalidArgument,
    WorkerIdUnavailable,
)
from leafpool.core.snowflake_layout import decode, wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from tests.support import registries, services
from tests.support.clocks import FakeMsClock
from tests.support.registries import LEASING, MODES, Backend

every_mode = pytest.mark.parametrize("backend", MODES, indirect=True)
leasing_modes = pytest.mark.parametrize("backend", LEASING, indirect=True)
#: the modes with a source besides the cache file
sourced_modes = pytest.mark.parametrize("backend", ["zk", "zk_recycle", "mysql"], indirect=True)
#: the modes that hold a worker ID for one identity (zk_recycle leases IDs, not identities)
identity_modes = pytest.mark.parametrize("backend", ["local", "zk", "mysql"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from registries.start(request.param, request, tmp_path)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(gone.stdout)


# -- claim and record --------------------------------------------------------------------


@every_mode
def test_claim_records_the_start_in_the_source_and_the_cache_file(backend: Backend) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = backend.open("host-a:w:0", clock)
    lease = reg.claim()
    now = int(clock.now)
    assert (lease.mode, lease.source, lease.identity) == (
        backend.mode,
        backend.source,
        "host-a:w:0",
    )
    assert reg.claim() is lease  # idempotent while held
    assert backend.held(reg, lease.worker_id)
    cached = json.loads(reg.cache.path.read_text())
    assert (cached["worker_id"], cached["last_timestamp"]) == (lease.worker_id, now)
    assert cached["identity"] == "host-a:w:0" and cached["token"] == reg.token
    assert backend.mark(reg, lease.worker_id) == now
    reg.record_high_water(now + 3_000)
    # the leasing modes record the mark ahead, covering the lease (docs/design.md §8.1)
    recorded = max(now + 3_000, now + reg.ahead_ms())
    assert reg.ahead_ms() == (7_000 if backend.mode == "zk_recycle" else
                              23_000 if backend.mode == "mysql" else 0)
    assert backend.mark(reg, lease.worker_id) == recorded
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == now + 3_000
    reg.record_high_water(now + 1_000)  # never lowered
    assert backend.mark(reg, lease.worker_id) == recorded
    assert reg.high_water_ms == now + 3_000
    leftovers = [
        p.name for p in reg.cache.path.parent.iterdir()
        if not p.name.endswith((".json", ".lock")) and p.name != "layout.record"
    ]
    assert leftovers == []  # the cache file (and local's layout record) written atomically


@every_mode
def test_identities_get_distinct_worker_ids(backend: Backend) -> None:
    leases = [backend.open(f"host-{h}:w:0").claim() for h in "abc"]
    assert len({lease.worker_id for lease in leases}) == 3


@every_mode
def test_check_and_record_need_a_claim(backend: Backend) -> None:
    reg = backend.open("host-a:w:0")
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.check()
    assert "no worker ID claimed" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        reg.record_high_water(wall_clock_ms())
    reg.claim()
    reg.check()
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(InvalidArgument) as bad_err:
            reg.record_high_water(bad)
        assert bad_err.value.field == "ms"
    reg.release()
    with pytest.raises(WorkerIdUnavailable):
        reg.check()


@every_mode
def test_a_hostile_identity_names_only_its_own_cache_file(backend: Backend, tmp_path: Path) -> None:
    overrides = {"snowflake_local_map": "5"} if backend.mode == "local" else {}
    reg = backend.open("../../evil:n:0", **overrides)
    reg.claim()
    assert reg.cache.path.parent == tmp_path / "cache" / backend.name
    assert reg.cache.path.exists()


@every_mode
def test_tick_reports_the_clock_to_the_source_and_the_cache_file(backend: Backend) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = backend.open("host-a:w:0", clock)
    worker_id = reg.claim().worker_id
    clock.advance(3_000)
    reg.tick()
    assert backend.mark(reg, worker_id) == clock.now + reg.ahead_ms()  # the lease covered
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == clock.now
    reg.check()  # a renew, in the leasing modes


@every_mode
def test_the_background_thread_ticks_until_release(backend: Backend) -> None:
    reg = backend.open("host-a:w:0", wall_clock_ms, background=True, **backend.fast_tick)
    worker_id = reg.claim().worker_id
    assert reg._ticker is not None
    thread = reg._ticker[0]
    assert thread.is_alive() and thread.daemon
    first = backend.mark(reg, worker_id)
    # bounded polling: the thread writes every fraction of a second; nothing tells us
    services.wait_until(lambda: backend.mark(reg, worker_id) > first, 10, "a tick")
    reg.check()
    reg.release()  # stops the ticker; under load its thread may need a moment to end
    services.wait_until(lambda: not thread.is_alive(), 30, "the ticker thread ended")


# -- restart -----------------------------------------------------------------------------


@every_mode
def test_restart_reuses_the_worker_id_above_the_recorded_mark(backend: Backend) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = backend.open("host-a:w:0", clock)
    with LeasedGenerator(reg, reg.settings, clock=clock, sleep=clock.sleep) as gen:
        first = gen.next_batch(1_000)
        worker_id = gen.lease.worker_id  # type: ignore[union-attr]
        recorded = backend.mark(reg, worker_id)
        assert recorded >= max(decode(i).timestamp_ms for i in first)
    assert not backend.held(reg, worker_id)
    clock.advance(5)
    again = backend.open("host-a:w:0", clock)
    gen2 = LeasedGenerator(again, again.settings, clock=clock, sleep=clock.sleep)
    lease = gen2.start()
    assert lease.worker_id == worker_id
    second = gen2.next_batch(1_000)
    assert min(second) > max(first)
    assert decode(second[0]).timestamp_ms > lease.last_timestamp_ms
    gen2.close()


@pytest.mark.parametrize("backend", ["zk", "mysql"], indirect=True)
def test_the_source_alone_remembers_the_worker_id(backend: Backend) -> None:
    first = backend.open("host-a:w:0")
    worker_id = first.claim().worker_id
    backend.open("host-b:w:0").claim()
    first.record_high_water(wall_clock_ms() + 2_000)
    mark = first.high_water_ms
    first.release(last_emitted_ms=mark - 2_000)
    assert not backend.held(first, worker_id)  # released: free at once
    again = backend.open("host-a:w:0", cache="other-cache")  # a new host: no cache file
    lease = again.claim()
    assert (lease.worker_id, lease.source) == (worker_id, backend.source)
    assert lease.last_timestamp_ms >= mark - 2_000


@every_mode
def test_start_wait_waits_out_a_small_gap(backend: Backend) -> None:
    now = wall_clock_ms()
    reg = backend.open("host-a:w:0", FakeMsClock(now))
    reg.claim()
    reg.record_high_water(now + 3_000)
    reg.release()
    clock = FakeMsClock(now + 1_000)
    waiting = backend.open("host-a:w:0", clock, start_wait_ms=5_000)
    lease = waiting.claim()
    assert lease.last_timestamp_ms == now + 3_000 and clock() >= now + 3_000
    assert sum(clock.sleeps) == pytest.approx(2.0)


# -- the clock behind the recorded mark ---------------------------------------------------


@sourced_modes
def test_clock_behind_the_mark_in_the_source_is_refused(backend: Backend) -> None:
    now = wall_clock_ms()
    reg = backend.open("host-a:w:0", FakeMsClock(now))
    worker_id = reg.claim().worker_id
    reg.record_high_water(now + 60_000)
    reg.release()  # no last_emitted: the recorded window stays
    before = backend.record(reg, worker_id)
    behind = backend.open("host-a:w:0", FakeMsClock(now + 1_000), cache="fresh-cache")
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert (err.value.worker_id, err.value.offset_ms) == (worker_id, 59_000)
    assert backend.where(reg, worker_id) in str(err.value)
    assert behind.lease is None
    assert backend.record(reg, worker_id) == before  # the refused claim wrote nothing
    assert not backend.held(reg, worker_id)  # and let go of what it took
    later = backend.open("host-a:w:0", FakeMsClock(now + 60_001), cache="fresh-cache")
    assert later.claim().worker_id == worker_id


@every_mode
def test_clock_behind_the_cache_file_is_refused_whatever_the_source_says(backend: Backend) -> None:
    now = wall_clock_ms()
    reg = backend.open("host-a:w:0", FakeMsClock(now))
    worker_id = reg.claim().worker_id
    reg.record_high_water(now + 30_000)
    reg.release()
    backend.set_mark(reg, worker_id, now)  # the source forgot the window (an old snapshot)
    behind = backend.open("host-a:w:0", FakeMsClock(now + 10))
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert err.value.offset_ms == 29_990
    assert f"the cache file {reg.cache.path}" in str(err.value)
    assert behind.lease is None
    later = backend.open("host-a:w:0", FakeMsClock(now + 30_000))
    assert later.claim().last_timestamp_ms == now + 30_000


@every_mode
def test_a_corrupt_cache_file_refuses_the_start(backend: Backend) -> None:
    reg = backend.open("host-a:w:0")
    reg.cache.path.parent.mkdir(parents=True)
    reg.cache.path.write_text("{not json")
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.claim()
    assert "corrupt" in str(err.value) and str(reg.cache.path) in str(err.value)
    assert reg.lease is None


# -- one identity, one process ------------------------------------------------------------


@identity_modes
def test_an_identity_held_by_a_live_process_is_refused(backend: Backend) -> None:
    live = backend.open("host-a:w:0")
    worker_id = live.claim().worker_id
    second = backend.open("host-a:w:0")
    with pytest.raises(WorkerIdUnavailable) as err:
        second.claim()
    assert ("held by another process" if backend.mode == "local" else "identity in use") in str(
        err.value
    )
    live.check()  # the live holder is left alone
    assert backend.held(live, worker_id)


@pytest.mark.parametrize("backend", ["zk", "mysql"], indirect=True)
def test_a_crashed_holder_of_the_identity_is_taken_over_and_fenced(backend: Backend) -> None:
    old = backend.open("host-a:w:0")
    worker_id = old.claim().worker_id
    backend.pretend_gone(old, dead_pid())  # it crashed: its session or lease lingers
    new = backend.open("host-a:w:0")
    assert new.claim().worker_id == worker_id
    with pytest.raises(WorkerIdUnavailable) as err:  # the old holder's token is stale
        old.record_high_water(wall_clock_ms() + 1_000)
    assert backend.taken_over_says in str(err.value)
    new.record_high_water(wall_clock_ms() + 1_000)
    new.check()


# -- release -----------------------------------------------------------------------------


@every_mode
def test_release_drops_the_window_and_lets_go(backend: Backend) -> None:
    now = wall_clock_ms()
    clock = FakeMsClock(now)
    reg = backend.open("host-a:w:0", clock)
    worker_id = reg.claim().worker_id
    reg.record_high_water(now + 3_000)
    clock.advance(10)
    reg.release(last_emitted_ms=now + 5)
    assert reg.lease is None and not backend.held(reg, worker_id)
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == now + 10
    assert backend.mark(reg, worker_id) == now + 10
    reg.release()  # twice: nothing more
    again = backend.open("host-a:w:0", clock)  # a quick restart is not refused
    lease = again.claim()
    assert (lease.worker_id, lease.last_timestamp_ms) == (worker_id, now + 10)


# -- lease lost, self-fencing --------------------------------------------------------------


@sourced_modes
def test_a_holder_whose_worker_id_was_taken_over_is_fenced_for_good(backend: Backend) -> None:
    reg = backend.open("host-a:w:0")
    gen = LeasedGenerator(reg, reg.settings, clock=reg.clock, sleep=reg.sleep)
    worker_id = gen.start().worker_id
    gen.next_batch(10)
    backend.take_over(reg, worker_id)
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.record_high_water(wall_clock_ms() + 60_000)
    assert backend.taken_over_says in str(err.value)
    assert reg.fenced is not None and backend.taken_over_says in reg.fenced
    assert gen.lease_state() == f"fenced: {reg.fenced}"
    with pytest.raises(WorkerIdUnavailable) as err2:
        gen.next_batch(10)
    assert "fenced" in str(err2.value)
    reg.tick()  # a fenced holder writes nothing more, not even a renew
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] < wall_clock_ms() + 60_000
    with pytest.raises(WorkerIdUnavailable):
        reg.check()


@pytest.mark.parametrize("backend", ["zk", "zk_recycle"], indirect=True)
def test_a_write_of_ours_that_landed_after_its_timeout_is_adopted(backend: Any) -> None:
    """A versioned write whose answer timed out may still have landed: the node's
    version moved on, but it holds our token. The next write adopts it instead of
    taking it for another process's write."""
    reg = backend.open("host-a:w:0")
    worker_id = reg.claim().worker_id
    now = wall_clock_ms()
    path = backend.mark_path(reg, worker_id)
    backend.zk.set(path, json.dumps({**backend.data(path), "timestamp": now + 1_000}).encode())
    reg.record_high_water(now + 2_000)
    assert reg.fenced is None
    assert backend.mark(reg, worker_id) == reg.source_mark >= now + 2_000
    backend.take_over(reg, worker_id)  # the same after another process's write: fenced
    with pytest.raises(WorkerIdUnavailable):
        reg.record_high_water(reg.source_mark + 1)  # beyond the mark: a write
    assert reg.fenced is not None


@leasing_modes
def test_a_missed_renew_self_fences_until_a_renew_succeeds(backend: Backend) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = backend.open("host-a:w:0", clock)
    reg.claim()
    reg.check()
    deadline = reg.deadline
    assert deadline.fence_after_s == pytest.approx(deadline.lease_s * 2 / 3)
    assert json.loads(reg.cache.path.read_text())["lease_until"] == deadline.until_wall
    clock.advance(deadline.fence_after_s * 1000 + 1)  # no renew for 2/3 of the lease
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.check()
    assert "not renewed" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        reg.record_high_water(wall_clock_ms() + 60_000)
    assert reg.fenced is None  # not for good: the lease may still be ours
    reg.tick()  # a renew succeeds
    reg.check()


@leasing_modes
def test_renew_must_be_shorter_than_two_thirds_of_the_lease(backend: Backend) -> None:
    with pytest.raises(ConfigurationError) as err:
        backend.open("h:n:0", snowflake_lease_seconds=3, snowflake_renew_seconds=2)
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_RENEW_SECONDS"
    assert "2/3" in str(err.value)


# -- the source unreachable or missing ------------------------------------------------------


@sourced_modes
def test_source_unreachable_and_no_cache_file_refuses_the_start(backend: Backend) -> None:
    reg = backend.open_unreachable("host-a:w:0", cache="empty")
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.claim()
    assert "unreachable" in str(err.value) and backend.unreachable_says in str(err.value)
    assert isinstance(err.value.__cause__, BackendUnavailable)
    assert err.value.__cause__.__cause__ is not None  # the driver's error, kept
    assert reg.lease is None


@sourced_modes
def test_a_missing_source_is_a_configuration_error(backend: Backend) -> None:
    overrides, field = backend.misconfigured()
    settings: Any = backend.settings(**overrides)
    with pytest.raises(ConfigurationError) as err:
        open_registry(settings, "h:n:0")
    assert err.value.field == field
