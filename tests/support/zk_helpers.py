"""ZooKeeper helpers for the worker-ID registry tests."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from tests.support import services


def unique_name() -> str:
    """A fresh ``snowflake_name``: every test gets its own /snowflake/{name} tree."""
    return f"t{uuid.uuid4().hex[:10]}"


@contextmanager
def raw_client(hosts: str, auth_data: list[tuple[str, str]] | None = None
               ) -> Iterator[KazooClient]:
    """A plain kazoo client (``auth_data``: kazoo's, e.g. a digest login), closed after."""
    client = KazooClient(hosts=hosts, timeout=10, auth_data=auth_data)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class StateLog:
    """Records a kazoo client's state changes; tests wait on them with a bound."""

    def __init__(self, client: KazooClient) -> None:
        self.states: list[str] = []
        self._cond = threading.Condition()
        client.add_listener(self._on)

    def _on(self, state: str) -> None:
        with self._cond:
            self.states.append(state)
            self._cond.notify_all()

    def wait_for(self, *sequence: str, timeout: float = 15.0) -> None:
        """Until ``sequence`` appears in order among the recorded states."""

        def seen() -> bool:
            it = iter(self.states)
            return all(any(s == want for s in it) for want in sequence)

        with self._cond:
            if not self._cond.wait_for(seen, timeout):
                raise TimeoutError(f"states {sequence} not seen in {timeout}s: {self.states}")


def wait_serving(hosts: str, timeout: float = 30.0) -> None:
    """Until ZooKeeper serves. Bounded polling of its ``srvr`` command: the client port
    opens before the server has loaded its data, and nothing tells us when it has."""
    host, _, port = hosts.partition(":")
    deadline = time.monotonic() + timeout
    answer = b""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1) as sock:
                sock.sendall(b"srvr")
                answer = sock.recv(4096)
            if answer.startswith(b"Zookeeper version"):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"ZooKeeper {hosts} not serving after {timeout}s: {answer!r}")


def expire_session(client: KazooClient, hosts: str) -> None:
    """Expire ``client``'s session from the server side: a second client joins the same
    session (id and password) and closes it, as if the holder had gone silent past the
    session timeout."""
    session_id, password = client.client_id
    other = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=10)
    other.start(timeout=15)
    other.stop()
    other.close()


def own_zookeeper() -> Iterator[services.Server]:
    """For a module fixture: a ZooKeeper of the tests' own, which they may kill."""
    server = services.zookeeper_server()
    wait_serving(server.extra["hosts"])
    try:
        yield server
    finally:
        server.stop()


def own_zk_fixture() -> Any:
    """A test module's ZooKeeper of its own: ``own_zk = own_zk_fixture()``."""
    return pytest.fixture(own_zookeeper, scope="module")


def restart(server: services.Server) -> None:
    """Start a killed ZooKeeper again and wait until it serves."""
    server.start()
    wait_serving(server.extra["hosts"])


__all__ = [
    "KazooState",
    "StateLog",
    "expire_session",
    "own_zk_fixture",
    "own_zookeeper",
    "raw_client",
    "restart",
    "unique_name",
    "wait_serving",
]
