"""The deployment a nemesis run starts, all real processes on 127.0.0.1: Redis (a master
and replicas from the shipped ``ops/redis/redis.conf``, three sentinels with the shipped
``ops/redis/sentinel.conf``'s timings), MariaDB, ZooKeeper (snowflake mode ``zk`` only),
two Celery workers and a beat over the same Sentinel group as broker, the HTTP service
(optional), and the client processes (tests/support/nemesis_client.py).

Two segment tags and one snowflake tag. The clients' settings: ``LEAFPOOL_REDIS_SENTINELS``,
``LEAFPOOL_REDIS_MASTER_NAME``, ``LEAFPOOL_POP_REPLICAS`` (a parameter: ``all``, shipped,
or ``1`` to show the stale-promotion hazard) and ``LEAFPOOL_EMPTY_POLICY`` per client.
Everything else is leafpool's defaults. :meth:`Deployment.stop` stops every process,
copies the Redis, Sentinel and MariaDB logs into the run directory and removes their
throwaway directories, whatever happened before.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leafpool.segment.store import SegmentStore
from tests.support.nemesis_history import HISTORY
from tests.support.nemesis_links import Fence, Link, fence_unusable
from tests.support.nemesis_procs import (
    CommandProcess,
    Managed,
    RedisProcess,
    SentinelProcess,
    ServerProcess,
)
from tests.support.processes import ROOT, leafpool_env
from tests.support.servers import Server, free_port, mariadb_server, zookeeper_server
from tests.support.topologies import (
    HOST,
    SentinelGroup,
    sentinel_group,
    shipped_sentinel_debug,
)

SENTINEL_CONF = ROOT / "ops" / "redis" / "sentinel.conf"
CELERY = [sys.executable, "-m", "celery", "-A", "workers"]
LEAFPOOL = [sys.executable, "-m", "leafpool.cli"]
MASTER_NAME = "leafpool"
#: the group IDs the fenced workers run with (tests/support/nemesis_links.py: Fence): two a
#: run, by the runner's process ID (runs at once use other Redis ports anyway)
FENCE_GIDS = 61000


@dataclass(frozen=True)
class SentinelTimings:
    down_after_ms: int
    failover_timeout_ms: int
    parallel_syncs: int
    quorum: int


def shipped_sentinel_timings(path: Path = SENTINEL_CONF) -> SentinelTimings:
    """The timings of the shipped sentinel.conf (what the run tests is what we ship; the
    SENTINEL DEBUG periods it names are applied too: ``shipped_sentinel_debug``)."""
    text = path.read_text()

    def value(directive: str) -> int:
        found = re.search(rf"^sentinel {directive} \S+ (\d+)\s*$", text, re.M)
        if found is None:
            raise ValueError(f"{path.name} has no 'sentinel {directive}'")
        return int(found.group(1))

    quorum = re.search(r"^sentinel monitor \S+ \S+ \d+ (\d+)\s*$", text, re.M)
    return SentinelTimings(value("down-after-milliseconds"), value("failover-timeout"),
                           value("parallel-syncs"), int(quorum.group(1)) if quorum else 2)


@dataclass
class DeployConfig:
    run_dir: Path
    seed: int = 0
    pop_replicas: str = "all"
    replicas: int = 2
    snowflake_mode: str = "local"  # or "zk"
    http: bool = False
    policies: tuple[str, ...] = ("wait", "wait", "reserve", "reserve")
    pace_s: float = 0.03  # per tag and client
    segment_tags: tuple[str, ...] = ("seg-a", "seg-b")
    snowflake_tag: str = "sf"
    concurrency: int = 2
    #: each worker reaches MariaDB (and ZooKeeper) through its own relay the nemesis can
    #: partition (tests/support/nemesis_links.py)
    links: bool = False
    settings: dict[str, Any] = field(default_factory=dict)  # more LEAFPOOL_* settings

    @property
    def tags(self) -> dict[str, str]:
        return {**{t: "segment" for t in self.segment_tags}, self.snowflake_tag: "snowflake"}


class Deployment:
    """Starts with :meth:`start`; :meth:`stop` always (also after a failed start)."""

    def __init__(self, cfg: DeployConfig) -> None:
        self.cfg = cfg
        self.logs = cfg.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        (cfg.run_dir / HISTORY).mkdir(exist_ok=True)
        self.timings = shipped_sentinel_timings()
        self.group: SentinelGroup | None = None
        self.db: ServerProcess | None = None
        self.zk: ServerProcess | None = None
        self.redis: list[RedisProcess] = []
        self.sentinels: list[SentinelProcess] = []
        self.workers: list[CommandProcess] = []
        self.beat: CommandProcess | None = None
        self.http: CommandProcess | None = None
        self.http_url: str | None = None
        self.clients: list[CommandProcess] = []
        self.links: list[Link] = []
        self.fences: list[Fence] = []
        self.env: dict[str, str] = {}

    # -- start ---------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        t = self.timings
        self.group = sentinel_group(
            self.cfg.replicas, 3, MASTER_NAME, down_after_ms=t.down_after_ms,
            failover_timeout_ms=t.failover_timeout_ms, parallel_syncs=t.parallel_syncs,
            quorum=t.quorum, debug=shipped_sentinel_debug())
        self.redis = [RedisProcess(n) for n in self.group.data]
        # the first sentinel is the run's listener's (tests/support/nemesis.py): not faulted
        self.sentinels = [SentinelProcess(s, shipped_sentinel_debug())
                          for s in self.group.sentinels[1:]]
        self.db = ServerProcess("mariadb", "db", mariadb_server())
        settings: dict[str, Any] = {}
        if self.cfg.snowflake_mode == "zk":
            self.zk = ServerProcess("zookeeper", "zk", zookeeper_server())
            settings |= {"zk_hosts": self.zk.server.extra["hosts"],
                         "snowflake_name": f"nemesis{self.cfg.seed}"}
        home = self.cfg.run_dir / "home"
        sentinels = ",".join(f"{h}:{p}" for h, p in self.group.sentinel_addrs)
        self.env = leafpool_env(
            home=home, redis_url="redis://sentinel-master/0", redis_sentinels=sentinels,
            redis_master_name=MASTER_NAME, database_url=self.db.server.extra["url"],
            pop_replicas=self.cfg.pop_replicas, snowflake_mode=self.cfg.snowflake_mode,
            snowflake_cache_dir=home / "snowflake", **settings, **self.cfg.settings)
        # the tags in the database; the beat's tag sync at its start registers them in
        # Redis and the refills fill them
        store = SegmentStore.from_url(self.db.server.extra["url"])
        store.init_schema()
        for tag in self.cfg.segment_tags:
            store.add_tag(tag, step=1000)
        store.add_snowflake_tag(self.cfg.snowflake_tag)
        store.engine.dispose()
        for i in (1, 2):
            argv = [*CELERY, "worker", "--loglevel=INFO", "-c", str(self.cfg.concurrency),
                    "-n", f"nemesis{i}@%h"]
            self.workers.append(CommandProcess(
                f"worker-{i}", "worker", self._fenced(i, argv), self._worker_env(i),
                self.logs / f"worker-{i}.log"))
        self.beat = CommandProcess(
            "beat", "beat", [*CELERY, "beat", "--loglevel=INFO", "-s",
                             str(self.cfg.run_dir / "beat-schedule")],
            self.env, self.logs / "beat.log")
        self._wait(self._pools_filled, timeout, "every pool filled")
        if self.cfg.http:
            port = free_port()
            self.http_url = f"http://{HOST}:{port}"
            self.http = CommandProcess("http", "http", [*LEAFPOOL, "serve", "--host", HOST,
                                                        "--port", str(port)],
                                       self.env, self.logs / "http.log")
        self._start_clients()
        self._wait(self._clients_served, timeout, "every client served")

    def _worker_env(self, i: int) -> dict[str, str]:
        """The environment of worker ``i``: with links, its database (and ZooKeeper)
        through relays of its own."""
        if not self.cfg.links:
            return self.env
        assert self.db is not None
        db = Link(f"db-link-{i}", "db-link", self.db.server.port)
        self.links.append(db)
        env = {**self.env, "LEAFPOOL_DATABASE_URL": self.db.server.extra["url"].replace(
            f":{self.db.server.port}/", f":{db.port}/")}
        if self.zk is not None:
            zk = Link(f"zk-link-{i}", "zk-link", self.zk.server.port)
            self.links.append(zk)
            env["LEAFPOOL_ZK_HOSTS"] = f"{HOST}:{zk.port}"
        return env

    def _fenced(self, i: int, argv: list[str]) -> list[str]:
        """Worker ``i``'s command: with links, run behind a fence the nemesis can raise
        between it and every Redis node and sentinel (its own group ID)."""
        if not self.cfg.links:
            return argv
        unusable = fence_unusable()
        if unusable is not None:
            raise RuntimeError(f"no Redis partition (--links) here: {unusable}")
        assert self.group is not None
        ports = [n.port for n in self.group.data] + [s.port for s in self.group.sentinels]
        fence = Fence(f"redis-link-{i}", "redis-link", FENCE_GIDS + 2 * (os.getpid() % 1000) + i,
                      ports)
        self.fences.append(fence)
        return fence.argv(argv)

    def _start_clients(self) -> None:
        tags = [f"{t}:{m}" for t, m in self.cfg.tags.items()]
        runs: list[tuple[str, dict[str, str], list[str]]] = [
            (f"client-{i}-{policy}", {**self.env, "LEAFPOOL_EMPTY_POLICY": policy}, [])
            for i, policy in enumerate(self.cfg.policies)]
        if self.http_url:
            runs.append(("http-0", self.env, ["--http", self.http_url]))
        for i, (name, env, extra) in enumerate(runs):
            argv = [sys.executable, "-m", "tests.support.nemesis_client",
                    str(self.cfg.run_dir / HISTORY / f"{name}.jsonl"), *tags,
                    "--seed", str(self.cfg.seed * 100 + i), "--pace", str(self.cfg.pace_s),
                    *extra]
            self.clients.append(CommandProcess(name, "client", argv, env,
                                               self.logs / f"{name}.log"))

    @staticmethod
    def _wait(check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = "never checked"
        while time.monotonic() < deadline:
            try:
                missing = check()
            except Exception as exc:
                missing = f"{type(exc).__name__}: {exc}"
            if missing is None:
                return
            last = missing
            time.sleep(0.2)
        raise TimeoutError(f"{what} not reached after {timeout}s: {last}")

    def _pools_filled(self) -> str | None:
        assert self.group is not None
        with self.group.current_master().client(decode_responses=True) as r:
            for tag in self.cfg.tags:
                if r.llen(f"leafpool:{{{tag}}}:ids") < 100:
                    return f"{tag} not filled"
        return None

    def _clients_served(self) -> str | None:
        for c in self.clients:
            path = self.cfg.run_dir / HISTORY / f"{c.name}.jsonl"
            if not c.alive():
                return f"{c.name} exited: {c.log.read_text()[-1500:]}"
            if not path.exists() or not re.search(r'"ids":\[\d', path.read_text()):
                return f"{c.name} has served nothing yet"
        return None

    # -- during the run ------------------------------------------------------------------

    def managed(self) -> list[Managed]:
        """Every process the supervisor restarts (not the clients: never faulted)."""
        procs: list[Managed] = [*self.workers, *self.redis, *self.sentinels]
        for p in (self.beat, self.http, self.db, self.zk):
            if p is not None:
                procs.append(p)
        return procs

    def master_port(self) -> int | None:
        """The master the sentinels name now (None while none answers)."""
        assert self.group is not None
        for s in self.group.live_sentinels():
            with contextlib.suppress(Exception):
                return self.group.master_addr(s)[1]
        return None

    def candidates(self, role: str) -> list[Managed]:
        if role == "redis-link":
            return list(self.fences)
        if role.endswith("-link"):
            return [link for link in self.links if link.role == role]
        if role in ("master", "replica"):
            port = self.master_port()
            nodes = [p for p in self.redis if p.alive() and not p.node.paused()]
            return [p for p in nodes if (p.node.port == port) == (role == "master")]
        return [p for p in self.managed() if p.role == role and p.alive()]

    def unhealthy(self) -> str | None:
        """What keeps the deployment from being whole (None: every process up, MariaDB
        answering, the master the sentinels name with every replica online)."""
        for p in [*self.managed(), *self.clients]:
            if not p.alive():
                return f"{p.name} down"
        if self.db is not None and not self.db.ready():
            return "mariadb not answering"
        assert self.group is not None
        port = self.master_port()
        master = next((p for p in self.redis if p.node.port == port), None)
        if master is None:
            return "no master named by the sentinels"
        info = master.node.info()
        if info.get("role") != "master":
            return f"{master.name} is {info.get('role')}"
        online = [k for k, v in info.items()
                  if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"]
        if len(online) < self.cfg.replicas:
            return f"{master.name} has {len(online)} replica(s) online"
        return None

    def accounting(self) -> dict[str, dict[str, int]]:
        """Per tag, read in one transaction on the master: ``pushed_total``, what clients
        counted (``gaps``, ``unacked_ids``, ``lost_replies``) and ``ready`` (list length)."""
        assert self.group is not None
        out: dict[str, dict[str, int]] = {}
        with self.group.current_master().client(decode_responses=True) as r:
            pipe = r.pipeline(transaction=True)
            for tag in self.cfg.tags:
                pipe.hget(f"leafpool:{{{tag}}}:state", "pushed_total")
                pipe.hgetall(f"leafpool:{{{tag}}}:hits")
                pipe.llen(f"leafpool:{{{tag}}}:ids")
            replies = pipe.execute()
        for i, tag in enumerate(self.cfg.tags):
            pushed, hits, ready = replies[3 * i: 3 * i + 3]
            out[tag] = {"pushed_total": int(pushed or 0), "ready": int(ready),
                        **{k: int(hits.get(k, 0))
                           for k in ("gaps", "unacked_ids", "lost_replies", "empty_hits")}}
        return out

    # -- stop ----------------------------------------------------------------------------

    def stop_clients(self) -> None:
        """SIGTERM: each client finishes its call in flight and flushes its history."""
        for c in self.clients:
            with contextlib.suppress(ProcessLookupError):
                c.resume()
        for c in self.clients:
            c.terminate()

    def stop(self) -> None:
        errors: list[str] = []
        for step in (self.stop_clients, self._stop_processes, self._keep_logs, self._remove):
            try:
                step()
            except Exception as exc:  # every step runs: nothing may be left behind
                errors.append(f"{step.__name__}: {type(exc).__name__}: {exc}")
        if errors:
            raise RuntimeError("; ".join(errors))

    def _stop_processes(self) -> None:
        for p in [*self.workers, self.beat, self.http]:
            if p is not None:
                p.stop()
        for link in self.links:
            link.stop()
        for fence in self.fences:
            fence.stop()
        for s in (self.db, self.zk):
            if s is not None:
                s.resume()

    def _keep_logs(self) -> None:
        servers: list[Server] = []
        if self.group is not None:
            servers += [n.server for n in self.group.members]
        servers += [s.server for s in (self.db, self.zk) if s is not None]
        for server in servers:
            with contextlib.suppress(OSError):
                shutil.copyfile(server.log, self.logs / f"{server.name}-{server.port}.log")

    def _remove(self) -> None:
        if self.group is not None:
            self.group.stop()
        for s in (self.db, self.zk):
            if s is not None:
                s.kill()
                s.server.stop()
