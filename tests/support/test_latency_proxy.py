"""The WAN proxy (tests/support/latency_proxy.py) in front of a loopback echo server: a
round trip costs twice the delay more, bytes in flight are not serialised behind each
other's delay, and a cut refuses and shuts connections until restored on the same port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.latency_proxy import LatencyProxy

WAIT = 10.0  # bound on every wait; never reached when things work


@pytest.fixture
def echo_port() -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    conns: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for c in conns:
        c.close()


def connect(proxy: LatencyProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_exactly(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        data = s.recv(n - len(got))
        assert data, f"EOF after {got!r}"
        got += data
    return got


def round_trip(s: socket.socket, payload: bytes = b"ping") -> float:
    t0 = time.monotonic()
    s.sendall(payload)
    assert read_exactly(s, len(payload)) == payload
    return time.monotonic() - t0


def test_a_round_trip_costs_twice_the_delay(echo_port: int) -> None:
    with LatencyProxy(echo_port, delay_ms=50).open() as proxy:
        s = connect(proxy)
        round_trip(s)  # the server-side connection is made
        took = min(round_trip(s) for _ in range(3))
        assert 0.100 <= took < 0.100 + 0.5, took
        proxy.set_delay(0)
        assert min(round_trip(s) for _ in range(3)) < 0.05
        proxy.set_delay(20)
        assert 0.040 <= round_trip(s) < 0.040 + 0.5
        s.close()


def test_bytes_in_flight_are_not_serialised(echo_port: int) -> None:
    """Ten messages sent 5 ms apart come back about 100 ms after each was sent, not one
    after another's delay (which would take a second)."""
    with LatencyProxy(echo_port, delay_ms=50).open() as proxy:
        s = connect(proxy)
        round_trip(s)
        t0 = time.monotonic()
        for i in range(10):
            s.sendall(bytes([i]))
            time.sleep(0.005)
        got = read_exactly(s, 10)
        took = time.monotonic() - t0
        assert got == bytes(range(10))  # in order
        assert 0.100 <= took < 0.5, took
        s.close()


def test_cut_refuses_and_shuts_restore_serves_on_the_same_port(echo_port: int) -> None:
    proxy = LatencyProxy(echo_port, delay_ms=5).open()
    try:
        port = proxy.port
        s = connect(proxy)
        round_trip(s)
        proxy.cut()
        assert proxy.is_cut and proxy.cuts == 1
        try:
            eof = s.recv(16) == b""
        except OSError:
            eof = True  # reset
        assert eof
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        proxy.restore()
        assert proxy.port == port and not proxy.is_cut
        s2 = connect(proxy)
        assert round_trip(s2) < WAIT
        assert proxy.accepted == 2
        s2.close()
    finally:
        proxy.stop()


def test_a_negative_delay_is_refused(echo_port: int) -> None:
    with pytest.raises(ValueError, match="delay_ms=-1"):
        LatencyProxy(echo_port, delay_ms=-1)
