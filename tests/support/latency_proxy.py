"""A TCP proxy that puts a WAN between a client and a server, for tests (stdlib sockets and
threads): every byte waits ``delay_ms`` in each direction, and the link can be cut and
restored on the same port.

The delay is on the bytes, not on the connection: each direction has a reader that stamps
every chunk it receives with ``now + delay`` and a writer that sends each chunk once its
time has come, in order. A request/reply round trip therefore costs ``2 x delay_ms`` more
(50 ms each way: 100 ms more a round trip, including the TCP-level handshake a client's
first packet waits for), and pipelined bytes are not serialised behind one another's
delay (bandwidth stays as it was).

``LatencyProxy(target_port, delay_ms=50).open()`` listens on a loopback port (``.port``);
``.set_delay(ms)`` changes the delay for bytes read from then on (a byte never overtakes
one read before it); ``.cut()`` takes the link away: the listener closes (new connections
are refused) and every open connection is shut; ``.restore()`` listens again on the same
port; ``.stop()`` is ``.cut()`` with every thread joined. ``.accepted`` counts client
connections, ``.cuts`` the cuts.

Used for a data center that reaches its database across a WAN (mode shared of
docs/design.md §12.2) and by the two-DC system tests and bench.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time

HOST = "127.0.0.1"


class LatencyProxy:
    def __init__(self, target_port: int, delay_ms: float = 50, target_host: str = HOST) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms={delay_ms!r}: must be >= 0")
        self.target = (target_host, target_port)
        self.delay_ms = float(delay_ms)
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def is_cut(self) -> bool:
        with self._lock:
            return self._listener is None

    def open(self) -> LatencyProxy:
        """Listen (on the same port as before, once there was one) and serve."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        self._spawn(self._accept, listener)
        return self

    def set_delay(self, ms: float) -> None:
        """The delay each way for bytes read from now on."""
        if ms < 0:
            raise ValueError(f"delay ms={ms!r}: must be >= 0")
        with self._lock:
            self.delay_ms = float(ms)

    def cut(self) -> None:
        """The link goes away: no new connection (refused), every open one shut."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
            if listener is not None:
                self.cuts += 1
        if listener is not None:
            _shut(listener)
        for s in sockets:
            _shut(s)

    def restore(self) -> None:
        """The link comes back on the same port (a no-op when it is up)."""
        if self.is_cut:
            self.open()

    def stop(self) -> None:
        """:meth:`cut`, and every thread of the proxy joined."""
        self.cut()
        for t in list(self._threads):
            t.join(timeout=10)

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _delay_s(self) -> float:
        with self._lock:
            return self.delay_ms / 1000.0

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True,  # type: ignore[arg-type]
                             name=f"latencyproxy-{self.port}")
        self._threads.append(t)
        t.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _shut(client)
                continue
            server.settimeout(None)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._listener is not listener:
                    _shut(client)
                    _shut(server)
                    return
                self.accepted += 1
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                pipe = _DelayedPipe(self, src, dst)
                self._spawn(pipe.read)
                self._spawn(pipe.write)


class _DelayedPipe:
    """One direction of one connection: bytes read from ``src`` are sent to ``dst`` once
    their delay has passed, in the order read; EOF travels the same way (after the bytes
    before it)."""

    def __init__(self, proxy: LatencyProxy, src: socket.socket, dst: socket.socket) -> None:
        self.proxy = proxy
        self.src = src
        self.dst = dst
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.last_due = 0.0

    def read(self) -> None:
        while True:
            try:
                data = self.src.recv(65536)
            except OSError:
                data = b""
            due = max(time.monotonic() + self.proxy._delay_s(), self.last_due)
            self.last_due = due
            with self.ready:
                self.queue.append((due, data))
                self.ready.notify()
            if not data:
                return

    def write(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                due, data = self.queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the bytes' time on the wire
            if not data:
                break
            try:
                self.dst.sendall(data)
            except OSError:
                break
        _shut(self.dst)
        _shut(self.src)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
