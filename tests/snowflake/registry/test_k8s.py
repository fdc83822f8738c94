"""Mode k8s in one process against a real ZooKeeper: the worker ID from the pod index
(setting or HOSTNAME's ordinal) plus the offset, refused at settings time beyond 1023;
two data centres with the same ordinals apart by their offsets (Leaf#187); the lease
of the one worker ID (a second holder refused naming the first, free again after a
release); the readiness file published while held and gone when released or fenced
(session expired), and ``leafpool probe``'s reading of stale files; the claim thread
claiming again after a lost lease. The pods as
processes: tests/snowflake/test_k8s_pods.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from leafpool.snowflake.registry.k8s import K8sRegistry, pod_index, pod_worker_id
from leafpool.snowflake.registry.ready import probe, ready_dir
from tests.support import services
from tests.support.processes import leafpool_env
from tests.support.zk_helpers import StateLog, expire_session, unique_name, wait_serving

ROOT = Path(__file__).resolve().parents[3]


def test_the_pod_index_comes_from_the_setting_else_the_hostname() -> None:
    s = load_settings(snowflake_mode="k8s")
    assert pod_index(s, "leafpool-snowflake-2") == 2
    assert pod_index(s, "web-7-12") == 12
    assert pod_index(load_settings(snowflake_pod_index=5), "leafpool-snowflake-2") == 5
    with pytest.raises(ConfigurationError) as err:
        pod_index(s, "0c9e1d2a3b4f")  # a container ID: no ordinal
    assert "LEAFPOOL_SNOWFLAKE_POD_INDEX" in str(err.value)


def test_two_data_centres_with_the_same_ordinals_apart_by_their_offsets() -> None:
    east = load_settings(snowflake_worker_offset=0)
    west = load_settings(snowflake_worker_offset=512)
    ids = {(dc, n): pod_worker_id(s, f"leafpool-snowflake-{n}")
           for dc, s in (("east", east), ("west", west)) for n in range(3)}
    assert sorted(ids.values()) == [0, 1, 2, 512, 513, 514]  # no two alike (Leaf#187)


def test_offset_plus_index_beyond_1023_is_refused_naming_the_offset() -> None:
    with pytest.raises(ConfigurationError) as err:
        pod_worker_id(load_settings(snowflake_worker_offset=1020), "leafpool-snowflake-4")
    assert "LEAFPOOL_SNOWFLAKE_WORKER_OFFSET" in str(err.value) and "1024" in str(err.value)
    with pytest.raises(ConfigurationError):
        load_settings(snowflake_worker_offset=1024)


@pytest.fixture
def make(zk_hosts: str, tmp_path: Path) -> Iterator[Any]:
    wait_serving(zk_hosts)
    name = unique_name()
    made: list[K8sRegistry] = []

    def open_one(hostname: str, cache: str = "a", **overrides: object) -> K8sRegistry:
        settings = load_settings(
            snowflake_mode="k8s", zk_hosts=zk_hosts, snowflake_name=name,
            snowflake_cache_dir=str(tmp_path / cache), snowflake_worker_offset=10,
            snowflake_lease_seconds=10, snowflake_renew_seconds=0.5, **overrides)
        reg = open_registry(settings, f"{hostname}:snowflake@{hostname}:0",
                            hostname=hostname, background=False)
        assert isinstance(reg, K8sRegistry)
        made.append(reg)
        return reg

    yield open_one
    for reg in made:
        reg.release()


def _ready(settings: Settings) -> list[int]:
    return [r.worker_id for r in probe(ready_dir(settings), wall_clock_ms())[0]]


def test_the_lease_of_the_pod_worker_id(make: Any) -> None:
    pod = make("leafpool-snowflake-3")
    assert pod.claim().worker_id == 13
    assert _ready(pod.settings) == [13]
    twin = make("leafpool-snowflake-3", cache="b")  # a replacement, the pod still running
    with pytest.raises(WorkerIdUnavailable) as err:
        twin.claim()
    assert "worker 13" in str(err.value) and "leafpool-snowflake-3:snowflake@" in str(err.value)
    assert _ready(twin.settings) == []
    gen = LeasedGenerator(pod, pod.settings)
    gen.start()
    last = gen.next_batch(100)[-1]
    gen.close()  # a clean stop gives the lease back at once
    assert _ready(pod.settings) == []
    twin_gen = LeasedGenerator(twin, twin.settings)
    assert twin_gen.start().worker_id == 13
    assert twin_gen.next_batch(1)[0] > last  # above the mark, kept in ZooKeeper
    assert _ready(twin.settings) == [13]


def test_a_lost_session_fences_and_withdraws_readiness(make: Any, zk_hosts: str) -> None:
    pod = make("leafpool-snowflake-0")
    assert pod.claim().worker_id == 10
    assert pod.ready.path.exists()
    assert pod.client is not None
    states = StateLog(pod.client)
    expire_session(pod.client, zk_hosts)
    states.wait_for("LOST")
    # kazoo calls the listeners in no set order: the registry's fences (and withdraws the
    # file, from kazoo's thread) around when the test's own hears LOST
    services.wait_until(lambda: pod.fenced is not None, 10, "fenced")
    with pytest.raises(WorkerIdUnavailable):
        pod.check()
    services.wait_until(lambda: not pod.ready.path.exists(), 10, "readiness withdrawn")
    pod.tick()  # a renew round of a fenced holder publishes nothing
    assert not pod.ready.path.exists()


def _probe_cli(settings: Settings, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = leafpool_env(home=tmp_path / "home", snowflake_cache_dir=settings.snowflake_cache_dir,
                       snowflake_name=settings.snowflake_name)
    return subprocess.run([sys.executable, "-m", "leafpool.cli", "probe", "snowflake"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_probe_snowflake_reads_fresh_files_only(make: Any, tmp_path: Path) -> None:
    pod = make("leafpool-snowflake-1")
    pod.claim()
    done = _probe_cli(pod.settings, tmp_path)
    assert done.returncode == 0 and "worker 11 (k8s, pid" in done.stdout, done.stderr
    record = json.loads(pod.ready.path.read_text())
    pod.ready.path.write_text(json.dumps({**record, "until_ms": wall_clock_ms() - 1}))
    done = _probe_cli(pod.settings, tmp_path)
    assert done.returncode == 1 and "lease not confirmed since" in done.stderr
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    # fresh, but its process gone (a fresh until: the probes above take seconds each)
    fresh = wall_clock_ms() + 60_000
    pod.ready.path.write_text(json.dumps({**record, "pid": int(dead.stdout), "until_ms": fresh}))
    done = _probe_cli(pod.settings, tmp_path)
    assert done.returncode == 1 and "gone" in done.stderr
    pod.tick()  # the next renew round rewrites it
    assert _probe_cli(pod.settings, tmp_path).returncode == 0
    assert os.getpid() == json.loads(pod.ready.path.read_text())["pid"]


def test_keep_claimed_claims_again_after_a_lost_lease(make: Any, zk_hosts: str) -> None:
    """The worker's claim thread (LEAFPOOL_SNOWFLAKE_CLAIM_AT_START): a holder fenced by
    a lost session stops and turns not ready, then claims its worker ID again, above
    everything it generated before."""
    pod = make("leafpool-snowflake-4")
    pod.background = True
    gen = LeasedGenerator(pod, pod.settings)
    stop = threading.Event()
    thread = threading.Thread(target=gen.keep_claimed, args=(stop, 0.1), daemon=True)
    thread.start()
    try:
        services.wait_until(lambda: _ready(pod.settings) == [14], 10, "claimed at start")
        before = gen.next_batch(100)
        first = pod.client
        assert first is not None
        states = StateLog(first)
        expire_session(first, zk_hosts)
        states.wait_for("LOST")
        assert pod.fenced is not None or pod.client is not first
        services.wait_until(lambda: pod.fenced is None and pod.client is not first
                            and _ready(pod.settings) == [14], 15, "claimed again")
        after = gen.next_batch(100)
        assert min(after) > max(before)
    finally:
        stop.set()
        thread.join(5)
        gen.close()
