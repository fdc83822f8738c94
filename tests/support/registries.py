"""Worker-ID registries under test, one backend a mode (local, zk, zk_recycle, mysql):
the settings, one factory that opens registries (a fake ms clock near the real time, no
background thread unless asked, every registry released at the end) and a view into the
mode's source (its recorded mark, who holds a worker ID, a takeover by another process).
The contract suite (tests/snowflake/registry/test_contract.py) runs one set of behaviours against
each; the per-mode tests use the same factory for what only their mode does."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kazoo.client import KazooClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from leafpool.core.config import Settings, load_settings
from leafpool.core.snowflake_layout import wall_clock_ms
from leafpool.snowflake.registry import BaseRegistry, open_registry
from tests.support.clocks import FakeMsClock
from tests.support.services import free_port
from tests.support.zk_helpers import unique_name, wait_serving

MODES = ("local", "zk", "zk_recycle", "mysql")
LEASING = ("zk_recycle", "mysql")
#: identities -> worker IDs of the local backend's static map
LOCAL_MAP = "host-a:w:0=1,host-b:w:0=2,host-c:w:0=3"


class Backend:
    """One mode under test."""

    mode: ClassVar[str]
    source: ClassVar[str]  # Lease.source of a claim from the source
    #: what record_high_water says once another process took the worker ID over
    taken_over_says: ClassVar[str] = ""
    #: what a start with the source unreachable and no cache file says
    unreachable_says: ClassVar[str] = ""
    #: settings under which the background thread runs every fraction of a second
    fast_tick: ClassVar[dict[str, object]] = {"snowflake_report_seconds": 0.05}

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.name = unique_name()
        self.made: list[BaseRegistry] = []

    def overrides(self) -> dict[str, object]:
        return {}

    def settings(self, cache: str = "cache", **overrides: object) -> Settings:
        values: dict[str, object] = {
            "snowflake_mode": self.mode,
            "snowflake_name": self.name,
            "snowflake_cache_dir": str(self.tmp_path / cache),
            **self.overrides(),
        }
        values.update(overrides)
        return load_settings(**values)

    def open(
        self, identity: str, clock: Callable[[], int] | None = None, cache: str = "cache", **kw: Any
    ) -> Any:
        """A registry of this mode (not claimed). ``snowflake_*``, ``zk_hosts`` and
        ``database_url`` keywords are settings; the rest go to the registry."""
        names = ("snowflake_", "zk_hosts", "database_url")
        settings = self.settings(cache, **{k: kw.pop(k) for k in list(kw) if k.startswith(names)})
        clock = clock or FakeMsClock(wall_clock_ms())
        if isinstance(clock, FakeMsClock):
            kw.setdefault("sleep", clock.sleep)
            kw.setdefault("monotonic", clock.monotonic)
        kw.setdefault("background", False)
        reg = open_registry(settings, identity, clock=clock, **kw)
        self.made.append(reg)
        return reg

    def open_unreachable(self, identity: str, **kw: Any) -> Any:
        """A registry whose source does not answer."""
        raise NotImplementedError

    def misconfigured(self) -> tuple[dict[str, object], str]:
        """Settings without a usable source, and the variable the error names."""
        raise NotImplementedError

    def close(self) -> None:
        for reg in self.made:
            reg.release()

    # -- the source ---------------------------------------------------------------------

    def mark(self, reg: Any, worker_id: int) -> int:
        """The high-water mark the source holds for ``worker_id``."""
        raise NotImplementedError

    def set_mark(self, reg: Any, worker_id: int, ms: int) -> None:
        """The source forgets: its mark goes back to ``ms`` (an old snapshot)."""
        raise NotImplementedError

    def record(self, reg: Any, worker_id: int) -> dict[str, Any]:
        """Everything the source keeps for ``worker_id``."""
        raise NotImplementedError

    def where(self, reg: Any, worker_id: int) -> str:
        """How a refused start names the source's record."""
        raise NotImplementedError

    def held(self, reg: Any, worker_id: int) -> bool:
        """Whether the source says the worker ID (zk: the identity) is held."""
        raise NotImplementedError

    def take_over(self, reg: Any, worker_id: int) -> None:
        """Another process takes ``worker_id`` over from ``reg``."""
        raise NotImplementedError

    def pretend_gone(self, reg: Any, pid: int) -> None:
        """``reg``'s process is gone: what it left behind names ``pid``, which has exited."""
        record = json.loads(reg.cache.path.read_text())
        record["pid"] = pid
        reg.cache.path.write_text(json.dumps(record))


class LocalBackend(Backend):
    mode = "local"
    source = "local-map"

    def overrides(self) -> dict[str, object]:
        return {"snowflake_local_map": LOCAL_MAP}

    def mark(self, reg: Any, worker_id: int) -> int:
        return int(json.loads(reg.cache.path.read_text())["last_timestamp"])

    def set_mark(self, reg: Any, worker_id: int, ms: int) -> None:
        """The cache file is the source: nothing else to forget."""

    def held(self, reg: Any, worker_id: int) -> bool:
        fd = os.open(reg.cache_dir / f"worker-{worker_id:04d}.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False


class ZooKeeperBackend(Backend):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.hosts: str = request.getfixturevalue("zk_hosts")
        wait_serving(self.hosts)  # its port opens before it serves
        self._client: KazooClient | None = None

    @property
    def zk(self) -> KazooClient:
        """A plain client of the test's own, as another process would be."""
        if self._client is None:
            self._client = KazooClient(hosts=self.hosts, timeout=10)
            self._client.start(timeout=15)
        return self._client

    def overrides(self) -> dict[str, object]:
        return {"zk_hosts": self.hosts}

    def open_unreachable(self, identity: str, **kw: Any) -> Any:
        return self.open(identity, zk_hosts=f"127.0.0.1:{free_port()}", connect_timeout_s=0.5, **kw)

    def misconfigured(self) -> tuple[dict[str, object], str]:
        return {"zk_hosts": " "}, "LEAFPOOL_ZK_HOSTS"

    def close(self) -> None:
        super().close()
        if self._client is not None:
            self._client.stop()
            self._client.close()

    def data(self, path: str) -> dict[str, Any]:
        return dict(json.loads(self.zk.get(path)[0]))

    def mark_path(self, reg: Any, worker_id: int) -> str:
        raise NotImplementedError

    def mark(self, reg: Any, worker_id: int) -> int:
        return int(self.data(self.mark_path(reg, worker_id))["timestamp"])

    def record(self, reg: Any, worker_id: int) -> dict[str, Any]:
        data, stat = self.zk.get(self.mark_path(reg, worker_id))
        return {"data": data, "version": stat.version}

    def set_mark(self, reg: Any, worker_id: int, ms: int) -> None:
        path = self.mark_path(reg, worker_id)
        self.zk.set(path, json.dumps({**self.data(path), "timestamp": ms}).encode())

    def where(self, reg: Any, worker_id: int) -> str:
        return f"ZooKeeper {self.mark_path(reg, worker_id)}"

    def take_over(self, reg: Any, worker_id: int) -> None:
        self.zk.set(
            self.mark_path(reg, worker_id), json.dumps({"timestamp": 1, "token": "other"}).encode()
        )


class ZkBackend(ZooKeeperBackend):
    mode = "zk"
    source = "zookeeper"
    taken_over_says = "written by another process"
    unreachable_says = "and there is no cache file"

    def mark_path(self, reg: Any, worker_id: int) -> str:
        return f"/snowflake/{self.name}/forever/{reg.safe_identity}-{worker_id:010d}"

    def held(self, reg: Any, worker_id: int) -> bool:
        return self.zk.exists(reg.temp_path) is not None

    def pretend_gone(self, reg: Any, pid: int) -> None:
        super().pretend_gone(reg, pid)
        self.zk.set(reg.temp_path, json.dumps({**self.data(reg.temp_path), "pid": pid}).encode())


class RecycleBackend(ZooKeeperBackend):
    mode = "zk_recycle"
    source = "zookeeper"
    taken_over_says = "written by the next holder"
    unreachable_says = "the cache file cannot stand in for it"
    fast_tick = {"snowflake_lease_seconds": 3, "snowflake_renew_seconds": 0.2}

    def overrides(self) -> dict[str, object]:
        return {**super().overrides(), "snowflake_lease_seconds": 6, "snowflake_renew_seconds": 1}

    def mark_path(self, reg: Any, worker_id: int) -> str:
        return str(reg.hw_path(worker_id))

    def held(self, reg: Any, worker_id: int) -> bool:
        return self.zk.exists(reg.lease_path(worker_id)) is not None


class MySqlBackend(Backend):
    mode = "mysql"
    source = "mysql"
    taken_over_says = "taken over"
    unreachable_says = "MySQL unreachable"
    fast_tick = {"snowflake_lease_seconds": 3, "snowflake_renew_seconds": 0.2}

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.url: str = request.getfixturevalue("mysql_url")
        self.db: Engine = create_engine(self.url)

    def overrides(self) -> dict[str, object]:
        return {
            "database_url": self.url,
            "snowflake_lease_seconds": 30,
            "snowflake_renew_seconds": 5,
        }

    def open_unreachable(self, identity: str, **kw: Any) -> Any:
        return self.open(
            identity, database_url=f"mysql+pymysql://u:p@127.0.0.1:{free_port()}/x", **kw
        )

    def misconfigured(self) -> tuple[dict[str, object], str]:
        return {"database_url": f"sqlite:///{self.tmp_path / 'x.db'}"}, "LEAFPOOL_DATABASE_URL"

    def close(self) -> None:
        super().close()
        self.db.dispose()

    def rows(self) -> dict[int, dict[str, Any]]:
        with self.db.connect() as conn:
            result = conn.execute(text("SELECT * FROM leaf_workerid_alloc ORDER BY id"))
            return {r.id: dict(r._mapping) for r in result}

    def execute(self, sql: str) -> None:
        with self.db.begin() as conn:
            conn.execute(text(sql))

    def mark(self, reg: Any, worker_id: int) -> int:
        return int(self.rows()[worker_id]["max_timestamp"])

    def record(self, reg: Any, worker_id: int) -> dict[str, Any]:
        return self.rows()[worker_id]

    def set_mark(self, reg: Any, worker_id: int, ms: int) -> None:
        self.execute(
            f"UPDATE leaf_workerid_alloc SET max_timestamp = {ms}, "
            f"update_time = update_time WHERE id = {worker_id}"
        )

    def where(self, reg: Any, worker_id: int) -> str:
        return f"MySQL leaf_workerid_alloc id={worker_id}"

    def held(self, reg: Any, worker_id: int) -> bool:
        return self.rows()[worker_id]["update_time"] is not None

    def take_over(self, reg: Any, worker_id: int) -> None:
        self.execute(f"UPDATE leaf_workerid_alloc SET port = 'other' WHERE id = {worker_id}")


BACKENDS: dict[str, type[Backend]] = {
    b.mode: b for b in (LocalBackend, ZkBackend, RecycleBackend, MySqlBackend)
}


def start(mode: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """For a fixture: the backend of ``mode``, closed (every registry released) after."""
    backend = BACKENDS[mode](request, tmp_path)
    try:
        yield backend
    finally:
        backend.close()


def fixture(mode: str) -> Any:
    """A test module's fixture giving the backend of ``mode``: ``zk = fixture("zk")``."""

    def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
        yield from start(mode, request, tmp_path)

    return pytest.fixture(backend)
