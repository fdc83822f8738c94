"""A TCP proxy in front of a MySQL/MariaDB server, for tests (stdlib sockets and threads):
a database host that can be taken away and brought back on the same port, and that can
lose the reply to a ``COMMIT``.

:class:`MysqlProxy` listens on a loopback port and opens one connection to the server per
client connection. It reads the client's side as MySQL packets (3-byte length, sequence
number, payload) to find a ``COMMIT`` (``COM_QUERY`` 0x03 with that text, as PyMySQL sends
it); the server's side is relayed as bytes.

``lose_commit_reply()`` arms one fault: the next ``COMMIT`` is forwarded and the server
runs it, its reply is read and thrown away, then both sockets are shut down and the
listener closed (the host is gone: new connections are refused), as when a database node
dies after committing and before answering. The client cannot tell whether the commit
happened. :meth:`close` takes the host away (listener and every connection);
:meth:`open` brings it back on the same port. ``accepted`` counts client connections.

``MysqlProxy(port, packets=False)`` relays any TCP protocol as bytes (no ``COMMIT`` fault):
a ZooKeeper host that goes away and comes back, its server running on meanwhile
(tests/snowflake/registry/test_recycle.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading

COMMIT = b"\x03COMMIT"
HOST = "127.0.0.1"


class MysqlProxy:
    def __init__(self, target_port: int, target_host: str = HOST, packets: bool = True) -> None:
        self.target = (target_host, target_port)
        self.packets = packets  # read the client's side as MySQL packets (the COMMIT fault)
        self.port = 0
        self.accepted = 0
        self.commits_lost = 0
        self._armed = False
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def open(self) -> MysqlProxy:
        """Listen (on the same port as before, once there was one) and serve."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)
        return self

    def lose_commit_reply(self) -> None:
        with self._lock:
            self._armed = True

    def close(self) -> None:
        """The host goes away: no new connection, every open one cut."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        if listener is not None:
            _shut(listener)
        for s in sockets:
            _shut(s)

    def stop(self) -> None:
        """:meth:`close`, and every thread of the proxy joined."""
        self.close()
        for t in self._threads:
            t.join(timeout=10)

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True,  # type: ignore[arg-type]
                             name=f"mysqlproxy-{self.port}")
        self._threads.append(t)
        t.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _shut(client)
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    _shut(client)
                    _shut(server)
                    return
                self.accepted += 1
                self._sockets += [client, server]
            link = _Link(self, client, server)
            self._spawn(link.client_to_server)
            self._spawn(link.server_to_client)

    def _take_fault(self) -> bool:
        with self._lock:
            armed, self._armed = self._armed, False
            return armed


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: MysqlProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.drop_reply = threading.Event()

    def client_to_server(self) -> None:
        buf = b""
        while True:
            try:
                data = self.client.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if not self.proxy.packets:
                try:
                    self.server.sendall(data)
                except OSError:
                    break
                continue
            buf += data
            while len(buf) >= 4:
                size = int.from_bytes(buf[:3], "little")
                if len(buf) < 4 + size:
                    break
                packet, buf = buf[:4 + size], buf[4 + size:]
                if packet[4:] == COMMIT and self.proxy._take_fault():
                    # set before the server can answer: its reply is the COMMIT's
                    self.drop_reply.set()
                try:
                    self.server.sendall(packet)
                except OSError:
                    break
        _shut(self.server)

    def server_to_client(self) -> None:
        while True:
            try:
                data = self.server.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if self.drop_reply.is_set():  # the COMMIT ran; its answer is lost with the host
                self.proxy.commits_lost += 1
                self.proxy.close()
                break
            try:
                self.client.sendall(data)
            except OSError:
                break
        _shut(self.client)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
