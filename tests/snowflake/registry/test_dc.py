"""Snowflake worker IDs across data centres (docs/design.md §12.1; issue 31 item 1), every
registry mode against its real source: each DC has a registry of its own (its own
ZooKeeper chroot, its own MariaDB database, its own cache directory), and

- workers of two DCs never share a worker ID: each DC leases from its range
  ``[DC_ID x R, (DC_ID + 1) x R)``, ``R = 1024 / DC_COUNT``;
- each registry records the layout it serves, and a worker whose DC settings disagree is
  refused, naming the setting, the recorded and the configured values;
- a registry without the record that holds worker IDs of before served DC 0 of 1: any
  other layout is refused there, DC 0 of 1 starts and records it;
- a DC whose range is used up is refused naming the DC, the range and the count;
- a cache file whose worker ID lies outside the DC's range is not started from;
- the previous release's workers (which know nothing of DCs) keep working against a
  registry that now holds the record.

With the ranges ignored (every DC leasing from 0) the first test fails: the two DCs'
workers share worker IDs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import dc_range
from leafpool.snowflake.registry import BaseRegistry, open_registry
from tests.support import services
from tests.support.own_mariadb import fresh_database
from tests.support.releases import previous_release
from tests.support.zk_helpers import raw_client, unique_name, wait_serving

MODES = ("local", "zk", "zk_recycle", "mysql", "k8s")
pytestmark = pytest.mark.timeout(240)


class Site:
    """One DC's registry: a ZooKeeper chroot, a MariaDB database or a cache directory of
    its own; :meth:`open` opens registries of ``mode`` on it with a DC layout."""

    def __init__(self, mode: str, request: pytest.FixtureRequest, tmp_path: Path, k: int,
                 name: str) -> None:
        self.mode, self.name = mode, name
        self.cache = tmp_path / f"site{k}-cache"
        self.source: dict[str, object] = {}
        self.made: list[BaseRegistry] = []
        if mode in ("zk", "zk_recycle", "k8s"):
            hosts = request.getfixturevalue("zk_hosts")
            wait_serving(hosts)
            chroot = f"/site{k}-{uuid.uuid4().hex[:8]}"
            with raw_client(hosts) as client:
                client.ensure_path(chroot)
            self.hosts = f"{hosts}{chroot}"
            self.source = {"zk_hosts": self.hosts}
            if mode != "zk":
                self.source.update(snowflake_lease_seconds=6, snowflake_renew_seconds=1)
        elif mode == "mysql":
            self.url = fresh_database(request.getfixturevalue("mariadb_server"))
            self.source = {"database_url": self.url, "snowflake_lease_seconds": 30,
                           "snowflake_renew_seconds": 5}

    def settings(self, dc_id: int, dc_count: int, **more: object) -> Settings:
        return load_settings(**{"snowflake_mode": self.mode, "snowflake_name": self.name,
                                "snowflake_cache_dir": str(self.cache), "dc_id": dc_id,
                                "dc_count": dc_count, **self.source, **more})

    def open(self, identity: str, dc_id: int, dc_count: int, *, index: int = 0,
             more: dict[str, object] | None = None) -> Any:
        settings = self.settings(dc_id, dc_count, **(more or {}))
        kw: dict[str, Any] = {"background": False}
        if self.mode == "k8s":
            kw["hostname"] = f"leafpool-snowflake-{index}"
        if self.mode in ("zk", "zk_recycle", "k8s"):
            kw["connect_timeout_s"] = 5.0
        reg = open_registry(settings, identity, **kw)
        self.made.append(reg)
        return reg

    def claim(self, identity: str, dc_id: int, dc_count: int, *, index: int = 0) -> int:
        return int(self.open(identity, dc_id, dc_count, index=index).claim().worker_id)

    def record(self) -> dict[str, Any] | None:
        """The layout record of this registry, as its source holds it (None: absent)."""
        if self.mode == "local":
            path = self.cache / self.name / "layout.record"
            return json.loads(path.read_text()) if path.exists() else None
        if self.mode == "mysql":
            engine = create_engine(self.url)
            try:
                with engine.connect() as conn:
                    row = conn.execute(text(
                        "SELECT dc_id, dc_count FROM leafpool_snowflake_layout")).first()
            finally:
                engine.dispose()
            return None if row is None else {"dc_id": row.dc_id, "dc_count": row.dc_count}
        with raw_client(self.hosts) as client:
            node = f"/snowflake/{self.name}/layout"
            if client.exists(node) is None:
                return None
            return dict(json.loads(client.get(node)[0]))

    def forget_record(self) -> None:
        """The registry as the previous release left it: worker IDs, no layout record."""
        if self.mode == "local":
            (self.cache / self.name / "layout.record").unlink()
        elif self.mode == "mysql":
            engine = create_engine(self.url)
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM leafpool_snowflake_layout"))
            engine.dispose()
        else:
            with raw_client(self.hosts) as client:
                client.delete(f"/snowflake/{self.name}/layout")

    def close(self) -> None:
        for reg in self.made:
            reg.release()


@pytest.fixture
def sites(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Site]]:
    """Two DCs' registries of the mode ``request.param``, with one snowflake name (the
    same deployment)."""
    name = unique_name()
    made = [Site(request.param, request, tmp_path, k, name) for k in (0, 1)]
    try:
        yield made
    finally:
        for site in made:
            site.close()


every_mode = pytest.mark.parametrize("sites", MODES, indirect=True)


@every_mode
def test_workers_of_two_dcs_with_separate_registries_never_share_a_worker_id(
    sites: list[Site]
) -> None:
    """DC 0 and DC 3 of 4 (ranges 0..255 and 768..1023), three workers each, each DC on
    its own registry: each registry knows only its own DC's workers, so only the ranges
    keep them apart."""
    west, east = sites
    got: dict[int, list[int]] = {0: [], 3: []}
    for i in range(3):
        for site, dc in ((west, 0), (east, 3)):
            got[dc].append(site.claim(f"host-{i}:w:0", dc, 4, index=i))
    shared = set(got[0]) & set(got[3])
    assert not shared, f"DCs 0 and 3 share worker IDs {sorted(shared)}: {got}"
    for dc, ids in got.items():
        assert len(set(ids)) == 3 and all(w in dc_range(dc, 4) for w in ids), (dc, ids)
    for site, dc in ((west, 0), (east, 3)):
        record = site.record()
        assert record is not None and (record["dc_id"], record["dc_count"]) == (dc, 4)


@every_mode
def test_a_worker_whose_dc_settings_disagree_with_the_record_is_refused_naming_both(
    sites: list[Site]
) -> None:
    site = sites[0]
    first = site.claim("host-a:w:0", 1, 2)
    assert first in dc_range(1, 2)
    with pytest.raises(ConfigurationError) as other_dc:
        site.open("host-b:w:0", 0, 2, index=1).claim()
    err = other_dc.value
    assert err.field == "LEAFPOOL_DC_ID" and err.value == 0
    assert "records that this registry serves DC 1 of 2 (worker IDs 512..1023)" in str(err)
    assert "configured as DC 0 of 2 (worker IDs 0..511)" in str(err)
    with pytest.raises(ConfigurationError) as other_count:
        site.open("host-c:w:0", 1, 4, index=2).claim()
    err = other_count.value
    assert err.field == "LEAFPOOL_DC_COUNT" and err.value == 4
    assert "serves DC 1 of 2" in str(err) and "configured as DC 1 of 4" in str(err)
    record = site.record()
    assert record is not None and (record["dc_id"], record["dc_count"]) == (1, 2)
    assert site.claim("host-d:w:0", 1, 2, index=3) in dc_range(1, 2)  # the right one starts


@every_mode
def test_a_registry_with_worker_ids_but_no_record_served_dc_0_of_1(sites: list[Site]) -> None:
    """The previous release's registry (worker IDs, no record): a worker of another
    layout is refused there (those IDs may lie in any DC's range); one DC starts as
    before and records it."""
    site = sites[0]
    reg = site.open("host-a:w:0", 0, 1)
    before = reg.claim().worker_id
    reg.release()
    site.forget_record()
    with pytest.raises(ConfigurationError) as refused:
        site.open("host-b:w:0", 1, 2, index=1).claim()
    assert refused.value.field == "LEAFPOOL_DC_COUNT"
    assert "is absent" in str(refused.value) and "from before the record" in str(refused.value)
    assert "serves DC 0 of 1" in str(refused.value)
    assert site.claim("host-a:w:0", 0, 1) == before
    record = site.record()
    assert record is not None and (record["dc_id"], record["dc_count"]) == (0, 1)


@every_mode
def test_a_dc_whose_range_is_used_up_is_refused_naming_the_dc_the_range_and_the_count(
    sites: list[Site]
) -> None:
    """1024 DCs: one worker ID each. DC 7's first worker takes 7; a second has none."""
    site = sites[0]
    assert site.claim("host-a:w:0", 7, 1024, index=0) == 7
    expected: type[Exception] = ConfigurationError if site.mode == "k8s" else WorkerIdUnavailable
    with pytest.raises(expected) as refused:
        site.open("host-b:w:0", 7, 1024, index=1).claim()
    message = str(refused.value)
    assert "DC 7 of 1024 (worker IDs 7..7)" in message and "1024" in message
    if site.mode == "k8s":
        assert refused.value.field == "LEAFPOOL_SNOWFLAKE_WORKER_OFFSET"  # type: ignore[attr-defined]


@pytest.mark.parametrize("sites", ["zk", "mysql"], indirect=True)
def test_a_cache_file_outside_the_dc_s_range_is_not_started_from(
    sites: list[Site], tmp_path: Path
) -> None:
    """The source unreachable, the cache file stands in (modes zk, mysql) only for a worker
    ID of this DC's range: one from before the DC settings changed is refused."""
    site = sites[0]
    reg = site.open("host-a:w:0", 0, 1)
    assert reg.claim().worker_id in dc_range(0, 2)  # and held: its cached lease runs
    port = services.free_port()
    gone: dict[str, object] = {"zk_hosts": f"127.0.0.1:{port}"} if site.mode == "zk" else {
        "database_url": f"mysql+pymysql://u:p@127.0.0.1:{port}/x"}
    unreachable = site.open("host-a:w:0", 1, 2, more=gone)
    with pytest.raises(WorkerIdUnavailable) as refused:
        unreachable.claim()
    assert "lies outside DC 1 of 2 (worker IDs 512..1023)" in str(refused.value)
    assert "the cache file" in str(refused.value)


OLD_CLAIM = """
import json, sys
from leafpool.core.config import load_settings
from leafpool.snowflake.registry import open_registry
settings = load_settings(**json.loads(sys.argv[1]))
reg = open_registry(settings, "old-host:w:0", background=False)
print(reg.claim().worker_id)
reg.release()
"""


@pytest.mark.parametrize("sites", ["local", "zk", "zk_recycle", "mysql"], indirect=True)
def test_the_previous_release_s_worker_runs_beside_a_registry_with_the_record(
    sites: list[Site], tmp_path: Path
) -> None:
    """A rollout: the previous release's worker (no DC settings: DC 0 of 1) claims from a
    registry one of ours recorded DC 0 of 1 in, and gets a worker ID of its own."""
    site = sites[0]
    ours = site.claim("new-host:w:0", 0, 1)
    old = previous_release(tmp_path / "release")
    values = {k: v for k, v in site.settings(0, 1).model_dump().items()
              if k in ("snowflake_mode", "snowflake_name", "snowflake_cache_dir", "zk_hosts",
                       "database_url", "snowflake_lease_seconds", "snowflake_renew_seconds")}
    env = old.env({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    done = subprocess.run([sys.executable, "-c", OLD_CLAIM, json.dumps(values)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = int(done.stdout.strip().splitlines()[-1])
    assert theirs != ours and theirs in dc_range(0, 1)
    record = site.record()
    assert record is not None and (record["dc_id"], record["dc_count"]) == (0, 1)
    assert site.claim("new-host:w:1", 0, 1) != ours  # ours still starts beside it
