"""Real servers on loopback: redis-server, MariaDB and ZooKeeper started on free ports
with throwaway data directories, for the tests and the benchmarks.

This module does not import pytest: the benchmarks (``./dev bench``, installed with the
``bench`` extra only) use it too. A missing binary raises :class:`NotInstalled`;
``tests/support/services.py`` turns that into a skip, or a failure under ``CI=true``.

Each server gets a parent-death SIGKILL (:mod:`leafpool.children`) when started from the
main thread: none outlives the test run or the benchmark that started it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from leafpool.children import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


class NotInstalled(RuntimeError):
    """A server binary is missing; ``what`` names the Debian package to install."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not installed (`./dev test` and `./dev bench` install it)")
        self.what = what


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Bounded polling: a server is ready when it answers, and we cannot be told earlier."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout}s")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Server:
    name: str
    port: int
    datadir: Path
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.datadir,
                start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL),
            )
        try:
            wait_until(lambda: port_open(self.port), timeout, self.name)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; log: {self.log.read_text()[-2000:]}") from exc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the server process (SIGKILL by default, as a crash)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        wait_until(lambda: not port_open(self.port), 10, f"{self.name} port release")

    def stop(self) -> None:
        """Stop the server for good and remove its data directory (:meth:`kill` keeps it:
        a test that crashes a server starts it again on the same data)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.datadir, ignore_errors=True)


def _tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"leafpool-{prefix}-"))


# -- Redis -----------------------------------------------------------------------------

def redis_server(config: Path | None = None, extra_args: list[str] | None = None,
                 tls_args: Callable[[int], list[str]] | None = None) -> Server:
    """A redis-server on a free port; ``config`` defaults to the shipped ops/redis.conf;
    ``tls_args(port)``: arguments that make the port a TLS port (tests/support/tls.py)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise NotInstalled("redis-server")
    port = free_port()
    datadir = _tmpdir("redis")
    # a copy in the server's own directory: CONFIG REWRITE (run by Sentinel on a failover,
    # or by a test) must never write into the shipped file
    conf = datadir / "redis.conf"
    shutil.copyfile(config or ROOT / "ops" / "redis" / "redis.conf", conf)
    argv = [binary, str(conf), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(datadir),
            "--daemonize", "no", "--save", "", "--logfile", ""]
    argv += extra_args or []
    argv += tls_args(port) if tls_args else []
    server = Server("redis", port, datadir, argv, datadir / "redis.log")
    server.extra["url"] = f"{'rediss' if tls_args else 'redis'}://127.0.0.1:{port}/0"
    server.start()
    return server


# -- MariaDB ---------------------------------------------------------------------------

#: pristine data directories made by mariadb-install-db, one a binary and user (the
#: bootstrap's fsyncs take 5-10 s on a busy machine; a copy of its result, about one)
MARIADB_TEMPLATES = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
    / "leafpool" / "mariadb-install-db"


def _install_argv(install: str, data: Path, user: str) -> list[str]:
    return [install, "--no-defaults", f"--datadir={data}", f"--user={user}",
            "--auth-root-authentication-method=normal", "--skip-test-db"]


def _template_key(install: str, user: str) -> str:
    """Over the install script's and the server binary's identity (path, size, mtime: a
    package upgrade is a new key) and the command line."""
    parts = [*_install_argv(install, Path("DATA"), user)]
    for name in ("mariadbd", "mysqld"):
        found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists()
                                       else None)
        if found:
            st = Path(found).stat()
            parts += [found, str(st.st_size), str(st.st_mtime_ns)]
    st = Path(install).stat()
    parts += [str(st.st_size), str(st.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _chown_tree(path: Path, user: str) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            shutil.chown(name, user, user)


def install_mariadb(data: Path, user: str = "root") -> Path:
    """``mariadb-install-db`` into ``data``, with a temporary directory of its own beside
    it, returned for the server's ``--tmpdir``: bootstraps running at once (the suite's
    workers) removed each other's temporary tables in /tmp ("Unknown table
    'mysql.tmp_user_sys'").

    The first install of a binary and user is kept as a template
    (:data:`MARIADB_TEMPLATES`) and the next ones are copies of it: the same files, as
    no server has run on them yet."""
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if install is None:
        raise NotInstalled("mariadb-server")
    tmp = data.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    shutil.chown(tmp, user, user)
    template = MARIADB_TEMPLATES / _template_key(install, user)
    if (template / "complete").exists():
        shutil.copytree(template / "data", data, symlinks=True)
        if user != "root":
            _chown_tree(data, user)
        return tmp
    subprocess.run(
        _install_argv(install, data, user),
        check=True, capture_output=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp)},
    )
    # kept for the next ones: copied under a name of its own, then renamed into place (a
    # concurrent install keeping its own copy finds the place taken and drops its copy)
    MARIADB_TEMPLATES.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=MARIADB_TEMPLATES))
    try:
        shutil.copytree(data, staging / "data", symlinks=True)
        (staging / "complete").touch()
        os.rename(staging, template)
    except OSError:
        pass  # another process's copy is in place (or the cache is not writable)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tmp


def mariadb_server(extra_args: list[str] | None = None) -> Server:
    """A MariaDB on a free port, user ``leafpool`` (all rights) over TCP, root over its
    socket; ``extra_args``: more server options (``--ssl-cert=...``)."""
    binary = shutil.which("mariadbd") or shutil.which("mysqld") or (
        "/usr/sbin/mariadbd" if Path("/usr/sbin/mariadbd").exists() else None)
    if binary is None:
        raise NotInstalled("mariadb-server")
    port = free_port()
    datadir = _tmpdir("mariadb")
    data = datadir / "data"
    try:
        tmp = install_mariadb(data)
    except BaseException:  # no server to stop: its directory goes now
        shutil.rmtree(datadir, ignore_errors=True)
        raise
    sock = datadir / "mysqld.sock"
    argv = [binary, "--no-defaults", f"--datadir={data}", f"--port={port}",
            "--bind-address=127.0.0.1", f"--socket={sock}", "--user=root",
            f"--tmpdir={tmp}", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=1", "--skip-log-bin",
            f"--pid-file={datadir / 'mysqld.pid'}", "--max-connections=500",
            *(extra_args or [])]
    server = Server("mariadb", port, datadir, argv, datadir / "mariadb.log")
    server.start(timeout=60)
    # root@localhost has no password; grant it over TCP for the tests' throwaway server
    client = shutil.which("mariadb") or shutil.which("mysql")
    if client is None:
        raise NotInstalled("mariadb-client")
    sql = ("CREATE USER IF NOT EXISTS 'leafpool'@'%' IDENTIFIED BY 'leafpool';"
           "GRANT ALL ON *.* TO 'leafpool'@'%';"
           "CREATE DATABASE IF NOT EXISTS leafpool;")
    subprocess.run([client, f"--socket={sock}", "-uroot", "-e", sql], check=True,
                   capture_output=True, timeout=30)
    server.extra["url"] = f"mysql+pymysql://leafpool:leafpool@127.0.0.1:{port}/leafpool"
    server.extra["socket"] = str(sock)
    server.extra["client"] = client
    return server


# -- ZooKeeper -------------------------------------------------------------------------

ZK_CLASSPATH = [
    "/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar",
    "/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-nop.jar",
    "/usr/share/java/netty-all.jar", "/usr/share/java/commons-cli.jar",
    "/usr/share/java/metrics-core.jar", "/usr/share/java/snappy-java.jar",
]


def zookeeper_argv(cfg: Path) -> list[str]:
    """The command line of a ZooKeeper server with the config file ``cfg`` (Debian's jars;
    ``-XX:-UsePerfData``: the JVM leaves no /tmp/hsperfdata_<user> behind)."""
    java = shutil.which("java")
    if java is None or not Path(ZK_CLASSPATH[0]).exists():
        raise NotInstalled("zookeeper (Debian package) or java")
    classpath = ":".join(p for p in ZK_CLASSPATH if Path(p).exists())
    return [java, "-Xmx256m", "-XX:-UsePerfData", "-cp", classpath,
            "-Dzookeeper.admin.enableServer=false",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)]


def zookeeper_server(extra_cfg: str = "") -> Server:
    """A ZooKeeper on a free port; ``extra_cfg``: more lines of its zoo.cfg."""
    port = free_port()
    datadir = _tmpdir("zk")
    cfg = datadir / "zoo.cfg"
    cfg.write_text(
        f"tickTime=500\ndataDir={datadir}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
        "maxSessionTimeout=20000\nminSessionTimeout=1000\n"
        "admin.enableServer=false\n4lw.commands.whitelist=ruok,stat,srvr\n" + extra_cfg
    )
    server = Server("zookeeper", port, datadir, zookeeper_argv(cfg), datadir / "zk.log")
    server.start(timeout=60)
    server.extra["hosts"] = f"127.0.0.1:{port}"
    return server
