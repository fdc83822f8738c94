"""Replicated MariaDB on loopback, for the tests and the benchmarks: a primary with an
asynchronous replica (binary log, ``CHANGE MASTER TO``), and a Galera cluster (Debian's
``galera-4``, SST by rsync). Debian's mariadbd, free ports, throwaway directories.

Like ``tests/support/servers.py`` (whose :class:`~tests.support.servers.Server` starts
every process here) and ``tests/support/topologies.py`` (its Redis counterpart, the model
of this one), this module does not import pytest; a missing binary raises
:class:`~tests.support.servers.NotInstalled`, which the tests' fixtures turn into a skip,
or a failure under ``CI=true``.

Every node gets a parent-death SIGKILL (:mod:`leafpool.children`) when started from the
main thread; :meth:`DbTopology.stop` SIGKILLs every node (the data is throwaway) and
removes the directories, and an ``atexit`` hook stops whatever a caller forgot.

Every wait is bounded polling for a state MariaDB is obliged to reach (a replica's threads
running and caught up, a Galera node ``Synced`` in a cluster of the expected size); a
timeout names the last state seen.

Each node has the user ``leafpool``/``leafpool`` (every privilege, from any host) and the
database ``leafpool``; ``root`` logs in without a password over the node's Unix socket.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors

from leafpool.children import die_with_parent
from tests.support.process_group import ProcessGroup, log_tail
from tests.support.servers import NotInstalled, Server, free_port, install_mariadb, port_open

__all__ = ["GALERA", "HOST", "AsyncReplicated", "DbNode", "DbTopology", "Galera",
           "async_replicated", "galera"]

HOST = "127.0.0.1"
USER = PASSWORD = DATABASE = "leafpool"
GALERA = Path("/usr/lib/galera/libgalera_smm.so")
CLUSTER_NAME = "leafpool-test"
#: Galera nodes run as Debian's ``mysql`` user: the rsync SST's daemon, run by root,
#: switches to ``nobody`` and cannot write the joiner's directory
GALERA_USER = "mysql"


def _binary(*names: str, package: str = "mariadb-server") -> str:
    for name in names:
        path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists()
                                      else None)
        if path is not None:
            return path
    raise NotInstalled(package)


def _wait(check: Callable[[], str | None], timeout: float, what: str,
          interval: float = 0.1) -> None:
    """Poll ``check`` (None when the state is reached, else what is missing) until
    ``timeout``; an exception counts as not there yet. The timeout names the last state."""
    deadline = time.monotonic() + timeout
    last = "never checked"
    while True:
        try:
            missing = check()
        except Exception as exc:  # a node still starting, a view change under way
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        last = missing
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s: {last}")
        time.sleep(interval)


# -- one node --------------------------------------------------------------------------

@dataclass
class DbNode:
    """One mariadbd process, its data directory and its Unix socket."""

    server: Server
    name: str
    #: the system user the process runs as from its start (None: this process's user)
    user: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def socket(self) -> Path:
        return self.server.datadir / "mysqld.sock"

    @property
    def url(self) -> str:
        """leafpool's URL of this node alone."""
        return f"mysql+pymysql://{USER}:{PASSWORD}@{HOST}:{self.port}/{DATABASE}"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def query(self, statement: str, timeout: float = 30.0) -> list[tuple[Any, ...]]:
        """One statement as root over the Unix socket; its rows (none for a write)."""
        conn = pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True,
                               connect_timeout=5, read_timeout=int(timeout),
                               write_timeout=int(timeout))
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    def slave_status(self) -> dict[str, Any]:
        """``SHOW SLAVE STATUS`` by column name (empty when the node replicates nothing)."""
        conn = pymysql.connect(unix_socket=str(self.socket), user="root", connect_timeout=5,
                               cursorclass=pymysql.cursors.DictCursor)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SLAVE STATUS")
                return dict(cur.fetchone() or {})
        finally:
            conn.close()

    def value(self, statement: str) -> Any:
        """The first column of the first row of ``statement`` (None when no row)."""
        rows = self.query(statement)
        return rows[0][0] if rows else None

    def status(self, name: str) -> str | None:
        """A ``SHOW GLOBAL STATUS`` value (None when the server has no such variable)."""
        rows = self.query(f"SHOW GLOBAL STATUS LIKE '{name}'")
        return str(rows[0][1]) if rows else None

    def start(self, timeout: float = 90.0) -> None:
        """Start the process (own session, parent-death SIGKILL) and wait until its socket
        answers; a process that exits first fails with the end of its log."""
        server = self.server
        with open(server.log, "ab") as log:
            # ``user``: set before the parent-death signal is (a change of user clears it,
            # so mariadbd is not left to drop root itself)
            server.proc = subprocess.Popen(
                server.argv, stdout=log, stderr=subprocess.STDOUT, cwd=server.datadir,
                start_new_session=True, user=self.user,
                preexec_fn=die_with_parent(signal.SIGKILL))
        proc = server.proc

        def answers() -> str | None:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}")
            self.query("SELECT 1")
            return None

        try:
            _wait(answers, timeout, f"{self.name} :{self.port}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; log: {self.log_tail()}") from exc

    def kill(self) -> None:
        """SIGKILL (a crash); returns once the process is gone and its port closed. The
        data directory stays (the node can be started again on it)."""
        proc = self.server.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        _wait(lambda: None if not port_open(self.port) else "open", 10,
              f"{self.name} :{self.port} closed")

    def stop(self) -> None:
        """SIGKILL without waiting for the port (throwaway data)."""
        proc = self.server.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def log_tail(self, chars: int = 2000) -> str:
        return log_tail(self.server, chars)


def _own(path: Path, user: str) -> None:
    """``chown -R user:user path``."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            shutil.chown(name, user, user)


def _base_argv(port: int, datadir: Path, user: str) -> list[str]:
    return [_binary("mariadbd", "mysqld"), "--no-defaults", f"--datadir={datadir / 'data'}",
            f"--port={port}", f"--bind-address={HOST}", f"--socket={datadir / 'mysqld.sock'}",
            f"--user={user}", f"--tmpdir={datadir / 'tmp'}", "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=1",
            f"--pid-file={datadir / 'mysqld.pid'}", "--max-connections=300"]


def _leafpool_user(node: DbNode) -> None:
    for statement in (f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'",
                      f"GRANT ALL ON *.* TO '{USER}'@'%'",
                      f"CREATE DATABASE IF NOT EXISTS {DATABASE}"):
        node.query(statement)


# -- topologies ------------------------------------------------------------------------

class DbTopology(ProcessGroup["DbNode"]):
    """Nodes and directories stopped and removed together (also a context manager)."""

    @property
    def nodes(self) -> list[DbNode]:
        return self.members

    def _node(self, name: str, argv_for: Callable[[int, Path, str], list[str]],
              install: bool = True, user: str | None = None) -> DbNode:
        """A node's directory (``data`` made by mariadb-install-db, or empty for a Galera
        joiner, which receives it by SST) and its command line, not started. ``user``:
        the system user the node runs as (its directory is given to it)."""
        port = free_port()
        datadir = self.tmpdir(name)
        if user is not None:
            shutil.chown(datadir, user, user)
        if install:
            install_mariadb(datadir / "data", user or "root")
        else:  # (its temporary directory: tests/support/servers.py install_mariadb)
            (datadir / "data").mkdir()
            (datadir / "tmp").mkdir()
        if user is not None:
            _own(datadir, user)
        node = DbNode(Server(name, port, datadir, argv_for(port, datadir, user or "root"),
                             datadir / f"{name}.log"), name, user)
        self.members.append(node)
        return node


class AsyncReplicated(DbTopology):
    """A primary and one asynchronous replica (row-based binary log, GTID positions)."""

    primary: DbNode
    replica: DbNode

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """The replica has applied everything the primary had logged when this was
        called (``MASTER_GTID_WAIT``)."""
        position = self.primary.value("SELECT @@gtid_binlog_pos")
        waited = self.replica.value(
            f"SELECT MASTER_GTID_WAIT('{position}', {timeout})")
        if int(waited) != 0:
            raise TimeoutError(f"replica :{self.replica.port} not at {position} after "
                               f"{timeout}s: {self.replica.query('SHOW SLAVE STATUS')}")

    def stop_io(self, timeout: float = 30.0) -> None:
        """``STOP SLAVE IO_THREAD``: what the primary commits from now on stays on it.
        Returns once the replica applied what it had received (its relay log)."""
        self.replica.query("STOP SLAVE IO_THREAD")
        self._wait_applied(timeout)

    def _wait_applied(self, timeout: float) -> None:
        def applied() -> str | None:
            status = self.replica.slave_status()
            read = (status["Master_Log_File"], int(status["Read_Master_Log_Pos"]))
            done = (status["Relay_Master_Log_File"], int(status["Exec_Master_Log_Pos"]))
            return None if done == read else f"applied {done}, received {read}"

        _wait(applied, timeout, f"replica :{self.replica.port} applied its relay log")

    def promote(self, timeout: float = 30.0) -> None:
        """What an operator or an orchestrator does once the primary is gone: the replica
        applies what it received (its relay log), stops replicating, and takes writes."""
        self._wait_applied(timeout)
        self.replica.query("STOP SLAVE")
        self.replica.query("RESET SLAVE ALL")
        self.replica.query("SET GLOBAL read_only = 0")


def async_replicated() -> AsyncReplicated:
    """A primary and an asynchronous replica, started and replicating; the replica is
    ``read_only`` (the leafpool user has every privilege, so ``read_only`` does not stop
    it: leafpool is pointed at the replica only once it is promoted)."""
    top = AsyncReplicated()
    try:
        def argv(server_id: int, extra: Sequence[str]) -> Callable[[int, Path, str], list[str]]:
            return lambda port, d, user: [*_base_argv(port, d, user), f"--server-id={server_id}",
                                    f"--log-bin={d / 'data' / 'binlog'}",
                                    "--binlog-format=ROW", "--sync-binlog=1",
                                    "--log-slave-updates", *extra]

        top.primary = top._node("mariadb-primary", argv(1, []))
        top.primary.start()
        _leafpool_user(top.primary)
        top.primary.query("CREATE USER IF NOT EXISTS 'repl'@'%' IDENTIFIED BY 'repl'")
        top.primary.query("GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%'")
        top.replica = top._node("mariadb-replica", argv(2, ["--read-only"]))
        top.replica.start()
        top.replica.query(
            f"CHANGE MASTER TO MASTER_HOST='{HOST}', MASTER_PORT={top.primary.port}, "
            "MASTER_USER='repl', MASTER_PASSWORD='repl', MASTER_USE_GTID=slave_pos, "
            "MASTER_CONNECT_RETRY=1")
        top.replica.query("START SLAVE")
        top.wait_caught_up()
        return top
    except BaseException:
        top.stop()
        raise


class Galera(DbTopology):
    """A Galera cluster: every node takes writes; a commit is certified by the whole
    cluster before it is acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.gcomm: list[str] = []  # each node's group-communication address

    def synced(self, node: DbNode, size: int) -> str | None:
        """None when ``node`` is ``Synced`` in a primary component of ``size`` nodes."""
        state = node.status("wsrep_local_state_comment")
        status = node.status("wsrep_cluster_status")
        seen = node.status("wsrep_cluster_size")
        if (state, status, seen) == ("Synced", "Primary", str(size)):
            return None
        return f"{state}, {status}, cluster size {seen}"

    def wait_synced(self, timeout: float = 90.0) -> None:
        """Every live node is ``Synced`` in one primary component of all live nodes."""
        live = [n for n in self.nodes if n.alive()]
        for node in live:
            _wait(lambda node=node: self.synced(node, len(live)), timeout,  # type: ignore[misc]
                  f"galera node :{node.port} synced in a cluster of {len(live)}")

    def wait_ready(self, node: DbNode, ready: bool, timeout: float = 30.0) -> None:
        """``node``'s ``wsrep_ready`` is ON (``ready``) or OFF (outside the primary
        component, e.g. isolated with ``gmcast.isolate``)."""
        want = "ON" if ready else "OFF"
        _wait(lambda: None if node.status("wsrep_ready") == want else "not yet", timeout,
              f"galera node :{node.port} wsrep_ready {want}")

    def url(self, nodes: Sequence[DbNode] | None = None) -> str:
        """leafpool's URL naming ``nodes`` (all by default), in order."""
        hosts = ",".join(n.address for n in (nodes or self.nodes))
        return f"mysql+pymysql://{USER}:{PASSWORD}@{hosts}/{DATABASE}"

    def node_on(self, port: int) -> DbNode:
        return next(n for n in self.nodes if n.port == port)

    def restart(self, node: DbNode, timeout: float = 90.0) -> None:
        """Start a killed node again on its data directory: it rejoins (IST, or SST when
        its state was lost with the crash) and is synced when this returns. The first
        node joins too: the cluster it bootstrapped goes on without it."""
        node.server.argv = [a for a in node.server.argv if a != "--wsrep-new-cluster"]
        node.start(timeout)
        self.wait_synced(timeout)


def _galera_argv(gcomm: str, own: str, ist: int, sst: int, bootstrap: bool,
                 provider_options: str) -> Callable[[int, Path, str], list[str]]:
    def argv(port: int, d: Path, user: str) -> list[str]:
        options = f"gmcast.listen_addr=tcp://{own};ist.recv_addr={HOST}:{ist};" \
                  f"gcache.size=64M;{provider_options}".rstrip(";")
        return [*_base_argv(port, d, user), "--wsrep-on=ON", f"--wsrep-provider={GALERA}",
                f"--wsrep-cluster-address=gcomm://{gcomm}",
                f"--wsrep-cluster-name={CLUSTER_NAME}", f"--wsrep-node-name=node-{port}",
                f"--wsrep-node-address={own}", f"--wsrep-node-incoming-address={HOST}:{port}",
                f"--wsrep-provider-options={options}", "--wsrep-sst-method=rsync",
                f"--wsrep-sst-receive-address={HOST}:{sst}", "--binlog-format=ROW",
                "--innodb-autoinc-lock-mode=2", "--default-storage-engine=InnoDB",
                *(["--wsrep-new-cluster"] if bootstrap else [])]
    return argv


def galera(n: int = 3, provider_options: str = "") -> Galera:
    """A Galera cluster of ``n`` nodes on loopback, every node synced; the first is
    bootstrapped (``--wsrep-new-cluster``) and the others join it one at a time by rsync
    SST. ``provider_options`` are added to ``wsrep_provider_options`` (e.g. shorter
    ``evs.*`` timeouts)."""
    if not GALERA.exists():
        raise NotInstalled("galera-4")
    _binary("rsync", package="rsync")
    top = Galera()
    try:
        own = [f"{HOST}:{free_port()}" for _ in range(n)]
        gcomm = ",".join(own)
        top.gcomm = own
        for i in range(n):
            node = top._node(f"galera{i + 1}", _galera_argv(
                gcomm, own[i], free_port(), free_port(), i == 0, provider_options),
                install=i == 0, user=GALERA_USER)
            node.start()
            if i == 0:
                _leafpool_user(node)
            top.wait_synced()
        return top
    except BaseException:
        top.stop()
        raise
