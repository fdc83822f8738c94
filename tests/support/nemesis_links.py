"""Network links the nemesis can partition: a TCP relay on loopback between one process
and one server (a Celery worker and MariaDB, a worker and ZooKeeper), and its fault; and
a fence between one process and every Redis node and sentinel (:class:`Fence`).

:class:`Link` listens on a free port and relays each connection to the server. ``cut``
partitions the link as a network that drops packets would: nothing is relayed either way
and new connections are accepted but not carried to the server, so the process's reads
and connects hang until its own timeouts, as behind a firewall dropping packets, not a
host that refuses. ``mend`` delivers what was held and relays again, as TCP's
retransmissions would after a partition shorter than their timeout. The relay is
threads and stdlib sockets (like tests/support/mysql_proxy.py, which refuses instead);
a link is a :class:`~tests.support.nemesis_procs.Managed` whose pause is the cut, so the
nemesis's :class:`~tests.support.nemesis_faults.Pause` action partitions it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Sequence

from tests.support.nemesis_procs import Managed

HOST = "127.0.0.1"
CHUNK = 65536


class Link(Managed):
    """A relay from ``port`` (free, chosen at start) to ``HOST:target_port``."""

    def __init__(self, name: str, role: str, target_port: int) -> None:
        super().__init__(name, role)
        self.target_port = target_port
        self._up = threading.Event()
        self._up.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"link-{name}", daemon=True).start()

    # -- Managed: a link is always "alive"; its pause is the partition ---------------------

    def alive(self) -> bool:
        return not self._closed.is_set()

    def pid(self) -> int | None:
        return None

    def pause(self) -> None:
        self._up.clear()

    def resume(self) -> None:
        self._up.set()

    def kill(self) -> None:
        raise RuntimeError("a link is partitioned (paused), not killed")

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._closed.set()
        self._up.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
            self._sockets.clear()

    @property
    def partitioned(self) -> bool:
        return not self._up.is_set()

    # -- relaying ----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._track(client)
        self._up.wait()  # a connect during the partition hangs (the SYN is dropped)
        try:
            server = socket.create_connection((HOST, self.target_port), timeout=5)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()
            return
        server.settimeout(None)
        self._track(server)
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.append(s)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:  # a close is held during the partition too
                    self._up.wait()
                    break
                self._up.wait()  # held, not dropped: delivered when the link mends
                if self._closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                for s in (src, dst):
                    if s in self._sockets:
                        self._sockets.remove(s)


class Fence(Managed):
    """A partition between one process and Redis: packets it sends to any of ``ports``
    (the data nodes and the sentinels) are dropped while the fence is up (paused), as a
    firewall dropping them would. Sentinel hands out the nodes' own addresses, so no relay
    can stand in between; the process runs with a group ID of its own (:meth:`argv`:
    ``setpriv --regid``) and an iptables rule on loopback drops what sockets of that group
    send to those ports (``-m owner --gid-owner``). Its connections stall (a connect's SYN
    is dropped, a sent command is never acknowledged) until its own timeouts or the fence
    lifts, and TCP's retransmissions carry what was held after that. Needs root and
    iptables (:func:`fence_unusable`)."""

    def __init__(self, name: str, role: str, gid: int, ports: Sequence[int]) -> None:
        super().__init__(name, role)
        self.gid = gid
        self.ports = list(ports)
        self.up = False

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run with this fence's group ID (its sockets are the fenced ones)."""
        return ["setpriv", f"--regid={self.gid}", "--clear-groups", "--", *command]

    def _rule(self) -> list[str]:
        return ["OUTPUT", "-o", "lo", "-p", "tcp", "-d", HOST, "-m", "multiport",
                "--dports", ",".join(map(str, self.ports)), "-m", "owner", "--gid-owner",
                str(self.gid), "-m", "comment", "--comment", f"leafpool nemesis {self.name}",
                "-j", "DROP"]

    def alive(self) -> bool:
        return True

    def pid(self) -> int | None:
        return None

    def pause(self) -> None:
        if not self.up:
            _iptables("-I", *self._rule())
            self.up = True

    def resume(self) -> None:
        if self.up:
            _iptables("-D", *self._rule())
            self.up = False

    def kill(self) -> None:
        raise RuntimeError("a fence is raised (paused), not killed")

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.resume()

    @property
    def partitioned(self) -> bool:
        return self.up


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True, timeout=30)


def fence_unusable() -> str | None:
    """Why a :class:`Fence` cannot be raised here (None: it can): it needs root, iptables
    (Debian's package, which ``./dev test`` installs) and setpriv (util-linux)."""
    if os.geteuid() != 0:
        return "a fence (iptables) needs root"
    for tool in ("iptables", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        _iptables("-S", "OUTPUT")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"iptables cannot be used here: {exc}"
    return None
