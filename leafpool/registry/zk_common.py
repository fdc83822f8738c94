"""ZooKeeper plumbing shared by the ``zk`` and ``zk_recycle`` modes: the kazoo client,
JSON node data, and wrapping kazoo's errors in :class:`BackendUnavailable` at the
boundary."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from leafpool.errors import BackendUnavailable, ConfigurationError

log = logging.getLogger(__name__)

#: every error kazoo raises (ZooKeeper errors, connection loss, session expiry, timeouts)
KAZOO_ERRORS: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError)


def require_hosts(hosts: str, mode: str) -> str:
    if not hosts.strip():
        raise ConfigurationError(
            "LEAFPOOL_ZK_HOSTS", hosts, f"a ZooKeeper connect string is required in "
            f"snowflake mode {mode} (e.g. 127.0.0.1:2181)",
        )
    return hosts.strip()


class SessionInfo:
    """The session timeout ZooKeeper actually granted (it may clamp the requested one
    into ``[minSessionTimeout, maxSessionTimeout]``); kazoo does not expose it, so it is
    read where kazoo's connection derives its read timeout from it."""

    def __init__(self, requested_s: float) -> None:
        self.requested_s = requested_s
        self.negotiated_s: float | None = None

    @property
    def timeout_s(self) -> float:
        """The granted timeout when known (else the requested one)."""
        return self.negotiated_s if self.negotiated_s is not None else self.requested_s

    def hook(self, client: KazooClient) -> None:
        conn = getattr(client, "_connection", None)
        original: Callable[..., Any] | None = getattr(conn, "_connect", None)
        if conn is None or original is None:  # pragma: no cover - other kazoo versions
            return

        def _connect(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            # kazoo returns (read_timeout_ms, connect_timeout_ms); read = 2/3 of the session
            with contextlib.suppress(TypeError, ValueError, IndexError):
                self.negotiated_s = float(result[0]) * 1.5 / 1000
            return result

        conn._connect = _connect


def connect(hosts: str, *, session_timeout_s: float, connect_timeout_s: float,
            what: str) -> tuple[KazooClient, SessionInfo]:
    """A started kazoo client, or :class:`BackendUnavailable`."""
    client = KazooClient(
        hosts=hosts,
        timeout=session_timeout_s,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0,
                                    max_jitter=0.1),
    )
    info = SessionInfo(session_timeout_s)
    info.hook(client)
    try:
        client.start(timeout=connect_timeout_s)
    except KAZOO_ERRORS as exc:
        # kazoo's stop waits for a connect attempt in flight (up to the session
        # timeout): let it finish in the background, the caller has waited enough
        threading.Thread(target=close, args=(client, what), name="leafpool-zk-close",
                         daemon=True).start()
        raise BackendUnavailable(f"{what}: ZooKeeper {hosts} unreachable: {exc!r}") from exc
    log.debug("%s: connected to ZooKeeper %s (session timeout %.1fs)", what, hosts,
              info.timeout_s)
    return client, info


def close(client: KazooClient | None, what: str = "leafpool") -> None:
    if client is None:
        return
    try:
        client.stop()
        client.close()
    except KAZOO_ERRORS as exc:  # pragma: no cover - closing a broken client
        log.debug("%s: closing the ZooKeeper client: %r", what, exc)


def dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def load(raw: bytes | None) -> dict[str, Any]:
    """Node data as a dict; empty or foreign data reads as ``{}``."""
    if not raw:
        return {}
    try:
        value = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def timestamp_of(data: dict[str, Any]) -> int:
    value = data.get("timestamp", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
