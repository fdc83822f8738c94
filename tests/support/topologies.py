"""Replicated Redis topologies on loopback, for the tests and the benchmarks: a master with
replicas, a Sentinel group, a Redis Cluster. Debian's redis-server 7.0 and redis-cli, free
ports, throwaway directories.

Like ``tests/support/servers.py`` (whose :class:`~tests.support.servers.Server` starts
every process here), this module does not import pytest; a missing binary raises
:class:`~tests.support.servers.NotInstalled` and ``tests/support/topology_fixtures.py``
turns that into a
skip, or a failure under ``CI=true``.

Each data node runs from its own copy of the configuration file (Sentinel's CONFIG REWRITE
writes into the file a node was started with). No process outlives its topology:
:meth:`Topology.stop` SIGKILLs every process (paused ones too) and removes the directories;
each process also gets a parent-death SIGKILL (:mod:`leafpool.children`) and an ``atexit``
hook stops whatever a caller forgot.

Every wait is bounded polling for a state Redis is obliged to reach (a replica's link up,
a sentinel's view of the group, ``cluster_state:ok``); a timeout names the last state seen.

Making a replica lag (:func:`stall`): a SIGSTOPped replica alone does not lag on loopback.
The master's replication stream still lands in the kernel's socket buffers, and a master
killed by SIGKILL (a process crash, not a lost machine) leaves those bytes to be delivered:
the replica resumes, reads them and applies the pop. ``stall`` writes more than the kernel
can buffer between the two processes after pausing the replica, so what the master
acknowledges next stays in the master's own memory, as behind a slow link or a partition,
and dies with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
from redis.cluster import ClusterNode, RedisCluster

from leafpool.children import die_with_parent
from tests.support.process_group import ProcessGroup
from tests.support.servers import ROOT, NotInstalled, Server, free_port
from tests.support.tls import Pki

__all__ = [
    "HOST", "REDIS_CONF", "Cluster", "ClusterEntry", "Node", "Replicated", "SentinelGroup",
    "Topology", "cluster", "replicated", "sentinel_group", "shipped_sentinel_debug", "stall",
]

HOST = "127.0.0.1"
REDIS_CONF = ROOT / "ops" / "redis" / "redis.conf"
STALL_CHUNK = 1 << 20


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # Debian: redis-server depends on redis-tools, which has redis-cli
        raise NotInstalled("redis-server" if name == "redis-server" else "redis-tools")
    return path


def _wait(check: Callable[[], str | None], timeout: float, what: str,
          interval: float = 0.05) -> None:
    """Poll ``check`` (None when the state is reached, else what is missing) until ``timeout``;
    an exception counts as not there yet. The timeout names the last state seen."""
    deadline = time.monotonic() + timeout
    last = "never checked"
    while True:
        try:
            missing = check()
        except Exception as exc:  # a node still starting, a failover under way
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        last = missing
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s: {last}")
        time.sleep(interval)


def _proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, T for stopped, Z...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _kernel_buffer_bound() -> int:
    """More bytes than the kernel can hold between two loopback processes: the largest
    receive buffer plus the largest send buffer TCP autotuning may reach (Redis sets
    neither explicitly), plus room for what the replica read but had not applied."""
    try:
        rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
        wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        rmem, wmem = 32 << 20, 32 << 20
    return rmem + wmem + 4 * STALL_CHUNK


# -- one process -----------------------------------------------------------------------

@dataclass
class Node:
    """One redis-server process: a data node (master, replica, cluster node) or a sentinel."""

    server: Server
    kind: str  # "data", "sentinel" or "cluster", as started
    #: redis-py's TLS options when the node speaks TLS only (tests/support/tls.py)
    tls_options: dict[str, Any] = field(default_factory=dict)
    #: the topology's own login (``username``, ``password``) when the node asks for one
    login: dict[str, str] = field(default_factory=dict)
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def addr(self) -> tuple[str, int]:
        return (HOST, self.server.port)

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls_options else 'redis'}://{HOST}:{self.server.port}/0"

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    @property
    def log(self) -> Path:
        return self.server.log

    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def paused(self) -> bool:
        return self.alive() and _proc_state(self.pid) == "T"

    @property
    def admin(self) -> redis.Redis:
        """A client of this node kept for the topology's own checks (closed on stop)."""
        if self._client is None:
            self._client = redis.Redis(HOST, self.port, socket_timeout=5,
                                       socket_connect_timeout=2, decode_responses=True,
                                       **self.tls_options, **self.login)
        return self._client

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client of this node; the caller closes it."""
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(HOST, self.port, **{**self.tls_options, **self.login, **kwargs})

    def info(self, section: str = "replication") -> dict[str, Any]:
        return self.admin.info(section)

    def command(self, *args: Any) -> Any:
        """One command on :attr:`admin`, its reply as redis-py parses it."""
        return self.admin.execute_command(*args)  # type: ignore[no-untyped-call]

    def role(self) -> str:
        """``master``, ``slave`` or ``sentinel`` (first field of ROLE)."""
        return str(self.admin.role()[0])

    def kill(self) -> None:
        """SIGKILL (a crash); returns once the process is gone and its port closed."""
        self._close()
        if self.alive():
            self.server.kill(signal.SIGKILL)

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP; returns once the kernel reports the process stopped."""
        os.killpg(self.pid, signal.SIGSTOP)
        _wait(lambda: None if _proc_state(self.pid) == "T" else "running", timeout,
              f"port {self.port} stopped")

    def resume(self, timeout: float = 10.0) -> None:
        """SIGCONT; returns once the kernel reports the process running again."""
        os.killpg(self.pid, signal.SIGCONT)
        _wait(lambda: None if _proc_state(self.pid) != "T" else "still stopped", timeout,
              f"port {self.port} resumed")

    def restart(self, timeout: float = 30.0) -> None:
        """Start the process again after :meth:`kill`, from its own data directory and
        configuration file (its append-only file as of the kill), on the same port;
        returns once it answers as itself."""
        if self.alive():
            raise RuntimeError(f":{self.port} is still running")
        if not _launch(self, timeout):
            raise RuntimeError(f":{self.port} was taken by another process")

    def stop(self) -> None:
        """SIGKILL without waiting for the port (throwaway data); works on a paused node."""
        self._close()
        proc = self.server.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _launch(node: Node, timeout: float = 30.0) -> bool:
    """Start ``node``'s process (as :meth:`Server.start` does: own session, parent-death
    SIGKILL) and wait until it answers as itself (INFO's process_id: an open port may be
    another process's). False if it exited because its port was taken."""
    server = node.server
    with open(server.log, "ab") as log:
        server.proc = subprocess.Popen(
            server.argv, stdout=log, stderr=subprocess.STDOUT, cwd=server.datadir,
            start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
    proc = server.proc

    def answers() -> str | None:
        if proc.poll() is not None:
            return None  # told apart below
        with redis.Redis(HOST, server.port, socket_timeout=1, socket_connect_timeout=1,
                         **node.tls_options, **node.login) as c:
            pid = int(c.info("server")["process_id"])
        return None if pid == proc.pid else f"port answered by pid {pid}"

    try:
        _wait(answers, timeout, f"{server.name} :{server.port}")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; log: {server.log.read_text(errors='replace')[-2000:]}") \
            from exc
    if proc.poll() is None:
        return True
    text = server.log.read_text(errors="replace")
    if "Address already in use" in text:
        return False
    raise RuntimeError(f"{server.name} :{server.port} exited with {proc.returncode}: "
                       f"{text[-2000:]}")


def _data_argv(port: int, datadir: Path, config: Path | None, appendfsync: str | None,
               extra_args: Iterable[str], tls: Pki | None = None,
               replica_of: int | None = None) -> list[str]:
    # a copy of its own: Sentinel's failover sends CONFIG REWRITE, which rewrites the file a
    # node was started with (the shipped config must never get a throwaway node's port).
    # A replica's first master goes in that file, not on the command line: a restart then
    # follows the master Sentinel last gave it (the file), where --replicaof would send it
    # back to its first master, by then perhaps a replica, until +fix-slave-config
    own = datadir / "redis.conf"
    shutil.copyfile(config or REDIS_CONF, own)
    if replica_of is not None:
        with own.open("a") as fh:
            fh.write(f"\nreplicaof {HOST} {replica_of}\n")
    argv = [_binary("redis-server"), str(own), "--port", str(port),
            "--bind", HOST, "--dir", str(datadir), "--daemonize", "no", "--save", "",
            "--logfile", "",
            # a replica's full sync starts at once (Redis waits 5 s for more replicas)
            "--repl-diskless-sync-delay", "0"]
    if appendfsync is not None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync={appendfsync!r}: use always, everysec or no")
        argv += ["--appendfsync", appendfsync]
    if tls is not None:  # TLS only, replication too
        argv += [*tls.tls_args(port), "--tls-replication", "yes"]
    return argv + list(extra_args)


# -- topologies ------------------------------------------------------------------------

class Topology(ProcessGroup[Node]):
    """Processes and directories stopped and removed together (also a context manager)."""

    def __init__(self, tls: Pki | None = None) -> None:
        super().__init__()
        self.tls = tls  # every process speaks TLS only (tests/support/tls.py)

    @property
    def processes(self) -> list[Node]:
        return self.members

    def _start(self, kind: str, name: str,
               argv_for: Callable[[int, Path], list[str]],
               login: dict[str, str] | None = None) -> Node:
        """A process on a free port (``argv_for(port, datadir)``); another free port if one
        was taken between choosing and binding (``argv_for`` chooses any other port anew).
        ``login``: the user and password the topology's own clients of it send."""
        for _ in range(3):
            port = free_port()
            datadir = self.tmpdir(name)
            server = Server(name, port, datadir, argv_for(port, datadir),
                            datadir / f"{name}.log")
            node = Node(server, kind, self.tls.client_options() if self.tls else {},
                        dict(login or {}))
            self.members.append(node)
            if _launch(node):
                return node
        raise RuntimeError(f"{name}: no free port after 3 tries; log: {server.log}")


class Replicated(Topology):
    """A master and its replicas (``replicaof``)."""

    def __init__(self, tls: Pki | None = None) -> None:
        super().__init__(tls)
        self.data: list[Node] = []  # master first, as started
        self.master: Node  # the current master (follows promote / wait_failover)

    @property
    def replicas(self) -> list[Node]:
        """Every data node that is not the current master (dead ones included)."""
        return [n for n in self.data if n is not self.master]

    def live_replicas(self) -> list[Node]:
        return [n for n in self.replicas if n.alive()]

    def _start_data(self, replica_of: Node | None, config: Path | None,
                    appendfsync: str | None, extra_args: Iterable[str]) -> Node:
        extra = list(extra_args)
        name = "redis-master" if replica_of is None else "redis-replica"
        node = self._start("data", name, lambda p, d: _data_argv(
            p, d, config, appendfsync, extra, self.tls,
            None if replica_of is None else replica_of.port))
        self.data.append(node)
        return node

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Every live, running replica follows the current master with its link up, has
        everything the master had written when this was called, and is online in the
        master's own view: the master counts it in ``WAIT`` only from then on (after a full
        resynchronisation, once it has the replica's first ``REPLCONF ACK``, which can come
        after the replica reports its link up)."""
        target = int(self.master.info()["master_repl_offset"])
        for node in self.live_replicas():
            if node.paused():
                continue

            def check(node: Node = node) -> str | None:
                info = node.info()
                if info.get("role") != "slave" or int(info["master_port"]) != self.master.port:
                    return f"{info.get('role')} of {info.get('master_port')}"
                if info["master_link_status"] != "up":
                    return f"link {info['master_link_status']}"
                offset = int(info["slave_repl_offset"])
                if offset < target:
                    return f"offset {offset} < {target}"
                seen = [v for k, v in self.master.info("replication").items()
                        if k.startswith("slave") and isinstance(v, dict)
                        and int(v.get("port", -1)) == node.port]
                state = seen[0].get("state") if seen else "absent"
                return None if state == "online" else f"{state} at the master"

            _wait(check, timeout, f"replica :{node.port} synced with :{self.master.port}")

    def stall(self, replica: Node, timeout: float = 60.0) -> int:
        """Pause ``replica`` so that it lags: see :func:`stall`."""
        return stall(self.master, replica, timeout)

    def promote(self, replica: Node, timeout: float = 30.0) -> None:
        """What Sentinel does, by hand: once ``replica`` sees its master gone (link down),
        ``REPLICAOF NO ONE``; it becomes the current master."""
        if replica.paused():
            raise RuntimeError(f"replica :{replica.port} is paused: resume it first")
        if self.master.alive() and not self.master.paused():
            raise RuntimeError(f"master :{self.master.port} is still running")

        def link_down() -> str | None:
            status = replica.info()["master_link_status"]
            return None if status == "down" else f"link {status}"

        _wait(link_down, timeout, f"replica :{replica.port} sees its master gone")
        replica.command("REPLICAOF", "NO", "ONE")
        _wait(lambda: None if replica.role() == "master" else replica.role(), timeout,
              f"replica :{replica.port} promoted")
        self.master = replica


def stall(master: Node, replica: Node, timeout: float = 60.0) -> int:
    """SIGSTOP ``replica``, then overwrite one filler key (``lp-stall``, outside leafpool's
    names) on ``master`` with more bytes than the kernel can buffer on the link. Whatever
    the master writes afterwards stays in its memory until the replica resumes: a SIGKILL
    of the master then loses it for the replica. The replica's output-buffer limit is
    lifted on the master so that the link is not cut meanwhile. Returns the master's
    replication offset after the filler: the stalled replica cannot get past it before it
    resumes."""
    replica.pause()
    master.admin.config_set("client-output-buffer-limit", "replica 0 0 0")
    chunk = b"x" * STALL_CHUNK
    deadline = time.monotonic() + timeout
    with master.client() as c:
        for _ in range(-(-_kernel_buffer_bound() // STALL_CHUNK)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"filling the link to :{replica.port} took over {timeout}s")
            c.set("lp-stall", chunk)
        return int(master.info()["master_repl_offset"])


def replicated(n_replicas: int = 1, config: Path | None = None, appendfsync: str | None = None,
               extra_args: Iterable[str] = (), timeout: float = 30.0) -> Replicated:
    """A master and ``n_replicas`` replicas, returned once every replica's link is up and
    its offset matches the master's. ``config`` defaults to the shipped ops/redis/redis.conf
    (appendfsync always); ``appendfsync`` overrides its fsync policy; ``extra_args`` go to
    every node."""
    extra = list(extra_args)
    top = Replicated()
    try:
        top.master = top._start_data(None, config, appendfsync, extra)
        for _ in range(n_replicas):
            top._start_data(top.master, config, appendfsync, extra)
        top.wait_synced(timeout)
    except BaseException:
        top.stop()
        raise
    return top


# -- Sentinel --------------------------------------------------------------------------

SENTINEL_CONF = ROOT / "ops" / "redis" / "sentinel.conf"


def shipped_sentinel_debug() -> list[str]:
    """The ``SENTINEL DEBUG`` arguments the shipped ops/redis/sentinel.conf says to apply
    once a sentinel has started (they are not configuration directives)."""
    for line in SENTINEL_CONF.read_text().splitlines():
        words = line.lstrip("# ").split()
        if words[:2] == ["SENTINEL", "DEBUG"]:
            return words[2:]
    raise LookupError(f"no SENTINEL DEBUG line in {SENTINEL_CONF.name}")


class SentinelGroup(Replicated):
    """A master, its replicas and the sentinels watching them."""

    def __init__(self, master_name: str, quorum: int, tls: Pki | None = None) -> None:
        super().__init__(tls)
        self.master_name = master_name
        self.quorum = quorum
        self.sentinels: list[Node] = []

    def live_sentinels(self) -> list[Node]:
        return [s for s in self.sentinels if s.alive() and not s.paused()]

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        """Every sentinel's address (for ``redis.sentinel.Sentinel``, LEAFPOOL_REDIS_SENTINELS)."""
        return [s.addr for s in self.sentinels]

    def node_at(self, addr: tuple[str, int]) -> Node:
        for node in self.data:
            if node.port == int(addr[1]):
                return node
        raise KeyError(f"no data node at {addr}")

    def master_addr(self, sentinel: Node | None = None) -> tuple[str, int]:
        """``SENTINEL get-master-addr-by-name`` from ``sentinel`` (default: the first live)."""
        s = sentinel or self.live_sentinels()[0]
        reply = cast("tuple[str, int] | None",
                     s.admin.sentinel_get_master_addr_by_name(self.master_name))
        if reply is None:
            raise KeyError(f"sentinel :{s.port} does not know {self.master_name}")
        return (str(reply[0]), int(reply[1]))

    def current_master(self) -> Node:
        return self.node_at(self.master_addr())

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Every live sentinel knows the current master as master, each of its live replicas
        (not down) and every other live sentinel."""
        replicas = {n.port for n in self.live_replicas()}
        others = len(self.live_sentinels()) - 1
        for s in self.live_sentinels():

            def check(s: Node = s) -> str | None:
                m = cast("dict[str, Any]", s.admin.sentinel_master(self.master_name))
                if m["port"] != self.master.port or not m["is_master"] or m["is_sdown"]:
                    return f"master :{m['port']} flags {m['flags']}"
                up = {r["port"] for r in s.admin.sentinel_slaves(self.master_name)
                      if r["is_slave"] and not (r["is_sdown"] or r["is_disconnected"])}
                if not replicas <= up:
                    return f"replicas up {sorted(up)}, want {sorted(replicas)}"
                if m["num-other-sentinels"] < others:
                    return f"{m['num-other-sentinels']} other sentinels, want {others}"
                return None

            _wait(check, timeout, f"sentinel :{s.port} ready", interval=0.1)

    def wait_down(self, node: Node, timeout: float = 30.0) -> None:
        """Until every live sentinel flags ``node`` (a replica) subjectively down."""
        for s in self.live_sentinels():

            def check(s: Node = s) -> str | None:
                for r in s.admin.sentinel_slaves(self.master_name):
                    if r["port"] == node.port:
                        return None if r["is_sdown"] else f"flags {r['flags']}"
                return "not known"

            _wait(check, timeout, f"sentinel :{s.port} sees :{node.port} down", interval=0.1)

    def wait_failover(self, old: Node | tuple[str, int] | None = None,
                      timeout: float = 30.0) -> Node:
        """Until a quorum of the live sentinels report a master other than ``old`` (default:
        the current master) and that node answers ROLE master; it becomes ``self.master``."""
        old_port = (self.master.port if old is None
                    else old.port if isinstance(old, Node) else int(old[1]))
        found: list[Node] = []

        def check() -> str | None:
            votes: dict[int, int] = {}
            for s in self.live_sentinels():
                try:
                    port = self.master_addr(s)[1]
                except redis.RedisError:
                    continue
                votes[port] = votes.get(port, 0) + 1
            new = [p for p, n in votes.items() if p != old_port and n >= self.quorum]
            if not new:
                return f"sentinels report {votes}"
            node = self.node_at((HOST, new[0]))
            if node.role() != "master":
                return f":{node.port} is {node.role()}"
            found.append(node)
            return None

        _wait(check, timeout, f"failover away from :{old_port}", interval=0.1)
        self.master = found[-1]
        return self.master


def sentinel_group(n_replicas: int = 2, n_sentinels: int = 3, master_name: str = "leafpool",
                   down_after_ms: int = 1000, failover_timeout_ms: int = 5000,
                   parallel_syncs: int = 1, debug: Iterable[str] = (),
                   quorum: int | None = None, config: Path | None = None,
                   appendfsync: str | None = None, extra_args: Iterable[str] = (),
                   timeout: float = 30.0, tls: Pki | None = None, sentinel_conf: str = "",
                   sentinel_login: dict[str, str] | None = None) -> SentinelGroup:
    """:func:`replicated` plus ``n_sentinels`` sentinels (``redis-server FILE --sentinel``,
    each with its own config file, which Sentinel rewrites) monitoring the master as
    ``master_name`` with ``quorum`` (default: a majority). Returned once every sentinel knows
    the master, its replicas and the other sentinels. ``tls``: every node and sentinel
    speaks TLS only, with this PKI's certificates (replication and Sentinel's links too).
    ``debug``: ``SENTINEL DEBUG`` arguments each sentinel gets once started (the shipped
    ones: :func:`shipped_sentinel_debug`). ``sentinel_conf``: lines added to each
    sentinel's config file (its ACL users, ``sentinel sentinel-user``...);
    ``sentinel_login``: the user and password the topology's own checks log in to the
    sentinels with (a user of ``sentinel_conf`` allowed INFO and SENTINEL's reads)."""
    quorum = quorum or n_sentinels // 2 + 1
    extra = list(extra_args)
    top = SentinelGroup(master_name, quorum, tls)
    try:
        top.master = top._start_data(None, config, appendfsync, extra)
        for _ in range(n_replicas):
            top._start_data(top.master, config, appendfsync, extra)
        top.wait_synced(timeout)
        binary = _binary("redis-server")
        for _ in range(n_sentinels):

            def argv(port: int, datadir: Path) -> list[str]:
                conf = datadir / "sentinel.conf"
                listen = tls.tls_conf(port) if tls else f"port {port}\n"
                conf.write_text(
                    f"{listen}bind {HOST}\ndaemonize no\nlogfile \"\"\ndir {datadir}\n"
                    f"sentinel monitor {master_name} {HOST} {top.master.port} {quorum}\n"
                    f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
                    f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {master_name} {parallel_syncs}\n{sentinel_conf}")
                return [binary, str(conf), "--sentinel"]

            sentinel = top._start("sentinel", "redis-sentinel", argv, sentinel_login)
            top.sentinels.append(sentinel)
            if debug:
                sentinel.command("SENTINEL", "DEBUG", *debug)
        top.wait_ready(timeout)
    except BaseException:
        top.stop()
        raise
    return top


# -- Cluster ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterEntry:
    """One line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[str, ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})


class Cluster(Topology):
    """A Redis Cluster: masters with slots and their replicas."""

    def __init__(self, node_timeout_ms: int, tls: Pki | None = None) -> None:
        super().__init__(tls)
        self.nodes: list[Node] = []
        self.node_timeout_ms = node_timeout_ms
        # remembered from every CLUSTER NODES read: after a failover the dead master is
        # listed without slots and without its replicas
        self._ids: dict[int, str] = {}
        self._replicas_seen: dict[str, set[int]] = {}
        self._slots_seen: dict[str, set[str]] = {}

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive() and not n.paused()]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [n.addr for n in self.live()]

    @property
    def url(self) -> str:
        """Any live node, as LEAFPOOL_REDIS_URL names it."""
        return self.live()[0].url

    def node_at(self, port: int) -> Node:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node at port {port}")

    def entries(self, via: Node | None = None) -> list[ClusterEntry]:
        """CLUSTER NODES as seen by ``via`` (default: the first live node)."""
        raw = (via or self.live()[0]).command("CLUSTER", "NODES")
        text = raw if isinstance(raw, str) else str(raw)
        out = []
        for line in text.strip().splitlines():
            f = line.split()
            port = int(f[1].split("@")[0].rsplit(":", 1)[1])
            flags = frozenset(f[2].replace("myself,", "").split(","))
            out.append(ClusterEntry(f[0], port, flags, None if f[3] == "-" else f[3],
                                    tuple(f[8:])))
        for e in out:
            self._ids[e.port] = e.node_id
            if e.master_id and not e.failed:
                self._replicas_seen.setdefault(e.master_id, set()).add(e.port)
            if e.is_master and e.slots and not e.failed:
                self._slots_seen[e.node_id] = set(e.slots)
        return out

    def masters(self) -> list[Node]:
        """The live masters serving slots."""
        return [self.node_at(e.port) for e in self.entries()
                if e.is_master and e.slots and not e.failed]

    def replicas_of(self, master: Node) -> list[Node]:
        entries = self.entries()
        mid = next(e.node_id for e in entries if e.port == master.port)
        return [self.node_at(e.port) for e in entries if e.master_id == mid]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A redis-py RedisCluster knowing every live node; the caller closes it."""
        kwargs.setdefault("socket_timeout", 10)
        nodes = [ClusterNode(h, p) for h, p in self.startup_nodes]  # type: ignore[no-untyped-call]
        tls = self.tls.client_options() if self.tls else {}
        return RedisCluster(startup_nodes=nodes, **tls, **kwargs)

    def wait_ok(self, masters: int, timeout: float = 30.0) -> None:
        """Every live node reports ``cluster_state:ok`` and sees the same picture: ``masters``
        healthy masters with slots and every other live node as the replica of one of them,
        its link to it up (gossip reaches the nodes one by one)."""

        def check() -> str | None:
            live = self.live()
            for node in live:
                state = node.command("CLUSTER", "INFO")
                if "cluster_state:ok" not in state:
                    return f":{node.port} cluster_state not ok"
                entries = self.entries(node)
                healthy = {e.node_id for e in entries
                           if e.is_master and e.slots and not e.failed}
                following = [e for e in entries
                             if e.master_id in healthy and not e.failed]
                if len(healthy) != masters or len(following) != len(live) - masters:
                    return (f":{node.port} sees {len(healthy)} masters and "
                            f"{len(following)} replicas")
                info = node.info()
                if info["role"] == "slave" and info["master_link_status"] != "up":
                    return f"replica :{node.port} link {info['master_link_status']}"
            return None

        _wait(check, timeout, "cluster ok", interval=0.1)

    def kill_master(self, master: Node | None = None) -> Node:
        """SIGKILL ``master`` (default: the first live master); returns it."""
        victim = master or self.masters()[0]
        self.entries()  # the topology as it was
        victim.kill()
        return victim

    def wait_promotion(self, killed: Node, timeout: float = 30.0) -> Node:
        """Until a former replica of ``killed`` (a master SIGKILLed, stopped or paused)
        serves its slots as master and the cluster is ok again on every live node; returns
        the promoted node. Also when the failover is over already."""
        self.entries()
        dead = self._ids[killed.port]
        candidates = self._replicas_seen.get(dead, set())
        wanted = self._slots_seen.get(dead, set())
        if not candidates or not wanted:
            raise RuntimeError(f":{killed.port} was not seen as a master with replicas")
        found: list[Node] = []

        def check() -> str | None:
            for e in self.entries():
                if e.port in candidates and e.is_master and not e.failed and \
                        wanted <= set(e.slots):
                    found.append(self.node_at(e.port))
                    return None
            return f"no replica of :{killed.port} serves {sorted(wanted)} yet"

        _wait(check, timeout, f"promotion of a replica of :{killed.port}", interval=0.1)
        healthy = len([e for e in self.entries() if e.is_master and e.slots and not e.failed])
        self.wait_ok(healthy, timeout)
        return found[-1]


def cluster(masters: int = 3, replicas_per_master: int = 1, node_timeout_ms: int = 1000,
            config: Path | None = None, appendfsync: str | None = None,
            extra_args: Iterable[str] = (), timeout: float = 60.0,
            tls: Pki | None = None) -> Cluster:
    """``masters * (1 + replicas_per_master)`` cluster nodes (each with its own bus port,
    ``cluster-port``), joined by ``redis-cli --cluster create``; returned once every node
    reports ``cluster_state:ok`` and every replica's link is up. ``node_timeout_ms`` is
    ``cluster-node-timeout`` (Redis's default, 15 s, makes failover tests slow). ``tls``:
    every node speaks TLS only, the cluster bus too."""
    if masters < 3:
        raise ValueError(f"masters={masters}: a Redis Cluster needs at least 3")
    extra = list(extra_args)
    cli = _binary("redis-cli")
    top = Cluster(node_timeout_ms, tls)
    tls_cli = ([] if tls is None else
               ["--tls", "--cacert", tls.ca, "--cert", tls.client_cert, "--key", tls.client_key])
    if tls is not None:
        extra += ["--tls-cluster", "yes"]
    try:
        for _ in range(masters * (1 + replicas_per_master)):

            def argv(port: int, datadir: Path) -> list[str]:
                return _data_argv(port, datadir, config, appendfsync, [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(datadir / "nodes.conf"),
                    "--cluster-port", str(free_port()),
                    "--cluster-node-timeout", str(node_timeout_ms), *extra], tls)

            top.nodes.append(top._start("cluster", "redis-cluster", argv))
        create = subprocess.run(
            [cli, *tls_cli, "--cluster", "create", *[f"{HOST}:{n.port}" for n in top.nodes],
             "--cluster-replicas", str(replicas_per_master), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
            preexec_fn=die_with_parent(signal.SIGKILL))
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}"
                               f"{create.stderr[-2000:]}")
        top.wait_ok(masters, timeout)
    except BaseException:
        top.stop()
        raise
    return top
