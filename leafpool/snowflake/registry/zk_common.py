"""What the ``zk`` and ``zk_recycle`` modes share: :class:`ZooKeeperRegistry` (the kazoo
client opened at the claim, kazoo's errors wrapped in :class:`BackendUnavailable`, the
versioned writes of the mark node and the adoption of a lost write) and JSON node data."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.retry import KazooRetry

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable, ConfigurationError, WorkerIdUnavailable
from leafpool.snowflake.registry import layout, zk_acl
from leafpool.snowflake.registry.base import BaseRegistry, Start
from leafpool.snowflake.registry.cache import CacheRecord

log = logging.getLogger(__name__)

#: every error kazoo raises (ZooKeeper errors, connection loss, session expiry, timeouts)
KAZOO_ERRORS = (KazooException, KazooTimeoutError)


class SessionInfo:
    """The session timeout ZooKeeper granted (it may clamp the requested one into
    ``[minSessionTimeout, maxSessionTimeout]``); kazoo does not expose it, so it is read
    where kazoo's connection derives its read timeout (2/3 of it) from it."""

    def __init__(self, client: KazooClient, requested_s: float) -> None:
        self.timeout_s = requested_s  # the granted timeout once known
        self.negotiated_s: float | None = None
        conn = getattr(client, "_connection", None)
        original = getattr(conn, "_connect", None)
        if original is None:  # pragma: no cover - other kazoo versions
            return

        def _connect(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)  # (read_timeout_ms, connect_timeout_ms)
            with contextlib.suppress(TypeError, ValueError, IndexError):
                self.negotiated_s = self.timeout_s = float(result[0]) * 1.5 / 1000
            return result

        conn._connect = _connect  # type: ignore[union-attr]


def close(client: KazooClient | None) -> None:
    """Stop and close a kazoo client (what a broken one raises meanwhile is moot)."""
    if client is not None:
        with contextlib.suppress(*KAZOO_ERRORS):
            client.stop()
            client.close()


def dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def load(raw: bytes | None) -> dict[str, Any]:
    """Node data as a dict; empty or foreign data reads as ``{}``."""
    try:
        value = json.loads(raw.decode()) if raw else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def timestamp_of(raw: bytes | None) -> int:
    """The ``timestamp`` of node data (0 when it has none)."""
    try:
        return int(load(raw).get("timestamp", 0))
    except (TypeError, ValueError):
        return 0


class ZooKeeperRegistry(BaseRegistry):
    """A registry whose source is ZooKeeper. The mode supplies ``_claim_with`` (the claim
    on a connected client) and, unless the cache file stands in, ``_unreachable`` (what a
    start without ZooKeeper does)."""

    def __init__(
        self,
        settings: Settings,
        identity: str,
        *,
        connect_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(settings, identity, **kwargs)
        self.hosts = settings.zk_hosts.strip()
        if not self.hosts:
            raise ConfigurationError(
                "LEAFPOOL_ZK_HOSTS",
                settings.zk_hosts,
                f"a ZooKeeper connect string is required in snowflake mode {self.mode} "
                "(e.g. 127.0.0.1:2181)",
            )
        self.connect_timeout_s = connect_timeout_s or min(10.0, settings.snowflake_lease_seconds)
        self.client: KazooClient | None = None
        self.session: SessionInfo | None = None
        self._version = -1  # the mark node's version this process last wrote

    @property
    def op_timeout_s(self) -> float:
        """How long one ZooKeeper operation may take: leasing, half the time left to
        renew before the holder fences itself."""
        if self.leased:
            return max(0.5, self.deadline.fence_after_s / 2)
        return min(10.0, self.settings.snowflake_lease_seconds)

    def _wait(self, result: IAsyncResult, timeout_s: float | None = None) -> Any:
        """The result of an asynchronous kazoo call, within ``timeout_s`` (default
        :attr:`op_timeout_s`)."""
        return result.get(timeout=self.op_timeout_s if timeout_s is None else timeout_s)

    def _connected(self) -> KazooClient | None:
        client = self.client
        return client if client is not None and client.state == KazooState.CONNECTED else None

    def _connect(self, timeout_s: float | None = None) -> tuple[KazooClient, SessionInfo]:
        """A started kazoo client, or :class:`BackendUnavailable`."""
        session_s = self.settings.snowflake_lease_seconds
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0, max_jitter=0.1)
        # LEAFPOOL_ZK_USERNAME/_PASSWORD: the digest login and the ACL of what it creates
        client = KazooClient(hosts=self.hosts, timeout=session_s, connection_retry=retry,
                             **zk_acl.client_options(self.settings.zk_login))
        info = SessionInfo(client, session_s)
        try:
            client.start(timeout=timeout_s or self.connect_timeout_s)
        except KAZOO_ERRORS as exc:
            # kazoo's stop waits for a connect attempt in flight (up to the session
            # timeout): let it finish in the background, the caller has waited enough
            threading.Thread(
                target=close, args=(client,), name="leafpool-zk-close", daemon=True
            ).start()
            raise BackendUnavailable(
                f"{self.identity}: ZooKeeper {self.hosts} unreachable: {exc!r}"
            ) from exc
        log.debug("%s: connected to ZooKeeper %s", self.identity, self.hosts)
        try:  # the nodes an earlier release made open get the login's ACL (zk_acl.py)
            zk_acl.secure(client, self.name, self.settings.zk_login, self.op_timeout_s)
        except (*KAZOO_ERRORS, ConfigurationError) as exc:
            threading.Thread(
                target=close, args=(client,), name="leafpool-zk-close", daemon=True
            ).start()
            if isinstance(exc, ConfigurationError):
                raise
            raise BackendUnavailable(
                f"{self.identity}: ZooKeeper {self.hosts}: ACL check failed: {exc!r}"
            ) from exc
        return client, info

    def _data(self, ts: int, **extra: object) -> bytes:
        """Node data: Leaf's Endpoint (``ip``, ``port``, ``timestamp``), our token and
        what the node adds."""
        return dump(
            {"ip": self.host, "port": self.rest, "timestamp": ts, "token": self.token, **extra}
        )

    def _acquire(self, cached: CacheRecord | None) -> Start:
        try:
            self.client, self.session = self._connect()
        except BackendUnavailable as exc:
            return self._unreachable(exc, cached)
        try:
            self._check_layout(self.client)
            start = self._claim_with(self.client, cached)
            self._recheck_layout(self.client)
            return start
        except KAZOO_ERRORS as exc:
            raise BackendUnavailable(f"{self.identity}: ZooKeeper claim failed: {exc!r}") from exc

    def _claim_with(self, client: KazooClient, cached: CacheRecord | None) -> Start:
        raise NotImplementedError

    @property
    def layout_path(self) -> str:
        """The record of the DC layout this tree serves (docs/design.md §12.1), shared
        by modes zk, zk_recycle and k8s of one ``LEAFPOOL_SNOWFLAKE_NAME``."""
        return f"/snowflake/{self.name}/layout"

    def _check_layout(self, client: KazooClient) -> None:
        """Compare the tree's layout record with this process's DC settings (raise
        :class:`ConfigurationError` on a mismatch); write it when there is none."""
        where = f"ZooKeeper {self.layout_path}"
        for _ in range(3):
            try:
                raw, _stat = client.get(self.layout_path)
            except NoNodeError:
                layout.check(self.dc, None, where, self._history(client))
                try:
                    client.create(self.layout_path, dump(layout.record_data(self.dc)),
                                  makepath=True)
                except NodeExistsError:
                    continue  # another worker wrote it meanwhile: compare with it
                log.info("%s: recorded in %s: this tree serves %s", self.identity,
                         self.layout_path, self.dc.describe())
                return
            layout.check(self.dc, layout.parse_record(load(raw), where), where, None)
            return
        raise WorkerIdUnavailable(f"{self.identity}: {self.layout_path} keeps changing")

    def _recheck_layout(self, client: KazooClient) -> None:
        """Once the claim's node exists, the record again: ``leafpool snowflake layout
        --set`` writes the record before it lists the nodes, so either it saw this
        claim's node or this read sees its record (ZooKeeper orders the two writes, and
        each client reads after its own). A record that does not serve this process's
        layout refuses the claim; the lease goes with the session the refusal closes."""
        where = f"ZooKeeper {self.layout_path}"
        raw, _stat = client.get(self.layout_path)
        layout.check(self.dc, layout.parse_record(load(raw), where), where, None)

    def _history(self, client: KazooClient) -> str | None:
        """What the tree holds of worker IDs from before its layout record, if any."""
        for below in ("forever", "recycle/hw"):
            path = f"/snowflake/{self.name}/{below}"
            try:
                children = client.get_children(path)
            except NoNodeError:
                continue
            if children:
                return f"{len(children)} nodes under {path}"
        return None

    def _unreachable(self, exc: BackendUnavailable, cached: CacheRecord | None) -> Start:
        return self._cached_start(f"ZooKeeper unreachable ({exc})", exc, cached)

    def _write_versioned(self, path: str, write: Callable[[], ZnodeStat], other: str,
                         timeout_s: float | None = None) -> None:
        """``write`` sets the mark node ``path`` at our last version. A BadVersion means
        someone wrote it since, unless that was our own earlier write which timed out
        here yet landed (the node holds our token): then its version is adopted and the
        write retried. Anyone else's write fences this holder: it was ``other``."""
        assert self.client is not None
        for _ in range(2):
            try:
                self._version = write().version
                return
            except BadVersionError:
                raw, stat = None, None
                with contextlib.suppress(*KAZOO_ERRORS):
                    raw, stat = self._wait(self.client.get_async(path), timeout_s)
                if stat is not None and load(raw).get("token") == self.token:
                    self._version = stat.version  # our own write landed: adopt its version
                    continue
                self._fence(f"{path} was written by {other}")
                self.check()  # raises
        raise WorkerIdUnavailable(f"{self.identity}: {path}: write failed")

    def _close(self) -> None:
        close(self.client)
        self.client = None
