"""Mode ``zk_recycle``: worker IDs 0..1023 leased from ZooKeeper and reclaimed when
their holder's session ends (NotFound9's mode of the same name, for hosts and ports that
come and go).

Layout::

    /snowflake/{name}/recycle/lease/0007   ephemeral: the lease, held by the holder's
        ZooKeeper session (timeout = snowflake_lease_seconds); data {"identity", "ip",
        "port", "token", "timestamp"}
    /snowflake/{name}/recycle/hw/0007      persistent: the worker ID's high-water mark
        {"timestamp", "identity", "token"}; it outlives every holder

A claim creates the first free lease node (this identity's previous worker ID first),
reads the high-water node, refuses when the local clock is behind it, and rewrites it
conditionally on its znode version. Every later write of the high-water node is a
transaction that checks the lease node and the high-water node's version: whoever
claims the worker ID next bumps that version, so a former holder's write can never
land after the next holder has read the mark, and the next holder always starts above
every timestamp a former holder pushed.

Self-fencing: :meth:`check` raises as soon as the connection is SUSPENDED or LOST, the
session changed, or no renew (a versioned write, every ``snowflake_renew_seconds``)
succeeded within 2/3 of the granted session timeout. kazoo declares a connection
SUSPENDED after 2/3 of the session timeout without an answer, and ZooKeeper expires the
session (and deletes the lease) only after the whole timeout, so the holder stops
before another process can get its worker ID.

A lease lives in a ZooKeeper session, so there is no start from the cache file in this
mode: a new process cannot hold a lease it could not create. The cache file is still
kept (worker ID and last timestamp) and its timestamp joins the start's clock check.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from leafpool.config import Settings
from leafpool.errors import BackendUnavailable, ConfigurationError, WorkerIdUnavailable
from leafpool.registry.base import BaseRegistry, Lease
from leafpool.registry.cache import CacheRecord
from leafpool.registry.zk_common import (
    KAZOO_ERRORS,
    SessionInfo,
    close,
    connect,
    dump,
    load,
    require_hosts,
    timestamp_of,
)
from leafpool.snowflake import MAX_WORKER_ID

log = logging.getLogger(__name__)

FENCE_FRACTION = 2 / 3
RELEASE_ERRORS: tuple[type[BaseException], ...] = (
    WorkerIdUnavailable, BackendUnavailable, *KAZOO_ERRORS)


class RecycleRegistry(BaseRegistry):
    mode = "zk_recycle"
    leased = True

    def __init__(self, settings: Settings, identity: str, *,
                 connect_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        self.hosts = require_hosts(settings.zk_hosts, self.mode)
        lease_s = settings.snowflake_lease_seconds
        if settings.snowflake_renew_seconds >= lease_s * FENCE_FRACTION:
            raise ConfigurationError(
                "LEAFPOOL_SNOWFLAKE_RENEW_SECONDS", settings.snowflake_renew_seconds,
                f"must be below 2/3 of LEAFPOOL_SNOWFLAKE_LEASE_SECONDS={lease_s} "
                "(the holder fences itself when no renew succeeded for that long)",
            )
        self.root = f"/snowflake/{self.name}/recycle"
        self.lease_dir = f"{self.root}/lease"
        self.hw_dir = f"{self.root}/hw"
        self.connect_timeout_s = connect_timeout_s or min(10.0, lease_s)
        self.client: KazooClient | None = None
        self.session: SessionInfo | None = None
        self._session_id: int | None = None
        self._hw_version = -1
        self._last_ok = 0.0  # monotonic time a successful renew was sent
        self._suspended_at: float | None = None

    def lease_path(self, worker_id: int) -> str:
        return f"{self.lease_dir}/{worker_id:04d}"

    def hw_path(self, worker_id: int) -> str:
        return f"{self.hw_dir}/{worker_id:04d}"

    @property
    def fence_after_s(self) -> float:
        """Without a successful renew for this long, the holder stops generating."""
        timeout = self.session.timeout_s if self.session else self.settings.snowflake_lease_seconds
        return timeout * FENCE_FRACTION

    @property
    def op_timeout_s(self) -> float:
        return max(0.5, self.fence_after_s / 2)

    def _tick_interval(self) -> float:
        return self.settings.snowflake_renew_seconds

    # -- claim --------------------------------------------------------------------------

    def _claim(self) -> Lease:
        try:
            client, info = connect(self.hosts,
                                   session_timeout_s=self.settings.snowflake_lease_seconds,
                                   connect_timeout_s=self.connect_timeout_s, what=self.identity)
        except BackendUnavailable as exc:
            raise WorkerIdUnavailable(
                f"{self.identity}: ZooKeeper unreachable ({exc}); in mode zk_recycle a "
                "worker ID is a lease held by a ZooKeeper session, so the cache file "
                "cannot stand in for it"
            ) from exc
        self.client, self.session = client, info
        self._suspended_at = None
        client.add_listener(self._on_state)
        try:
            return self._claim_with(client)
        except KAZOO_ERRORS as exc:
            self._close()
            raise BackendUnavailable(f"{self.identity}: ZooKeeper claim failed: {exc!r}") from exc
        except BaseException:
            self._close()
            raise

    def _claim_with(self, client: KazooClient) -> Lease:
        client.ensure_path(self.lease_dir)
        client.ensure_path(self.hw_dir)
        cached = self.read_cache()
        taken = {int(c) for c in client.get_children(self.lease_dir) if c.isdigit()}
        free = [w for w in range(MAX_WORKER_ID + 1) if w not in taken]
        if cached is not None and cached.worker_id in free:
            free.remove(cached.worker_id)
            free.insert(0, cached.worker_id)
        for worker_id in free:
            data = {"identity": self.identity, "ip": self.host, "port": self.rest,
                    "token": self.token, "timestamp": self.clock()}
            try:
                client.create(self.lease_path(worker_id), dump(data), ephemeral=True)
            except NodeExistsError:
                continue
            try:
                return self._adopt(client, worker_id, cached)
            except BaseException:
                with contextlib.suppress(*KAZOO_ERRORS):
                    client.delete(self.lease_path(worker_id))
                raise
        raise WorkerIdUnavailable(
            f"{self.identity}: all {MAX_WORKER_ID + 1} worker IDs are leased under "
            f"{self.lease_dir}; none is free to claim"
        )

    def _adopt(self, client: KazooClient, worker_id: int, cached: CacheRecord | None) -> Lease:
        self._session_id = client.client_id[0] if client.client_id else None
        path = self.hw_path(worker_id)
        for _ in range(10):
            try:
                raw, stat = client.get(path)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    client.create(path, dump({"timestamp": 0}))
                continue
            recorded, where = timestamp_of(load(raw)), f"ZooKeeper {path}"
            if cached is not None and cached.last_timestamp > recorded:
                recorded, where = cached.last_timestamp, f"the cache file {self.cache.path}"
            now = self._verify_clock(worker_id, recorded, where)
            ts = max(now, recorded)
            sent = self.monotonic()
            try:
                stat = client.set(path, self._hw_data(ts), version=stat.version)
            except BadVersionError:
                continue  # a former holder's late write: read the mark again
            self._hw_version = stat.version
            self._last_ok = sent
            self._high_water = ts
            self._write_cache(worker_id, ts)
            return Lease(worker_id, recorded, "zookeeper", self.identity, self.mode)
        raise WorkerIdUnavailable(f"{self.identity}: {path} keeps changing; not claimed")

    def _hw_data(self, ts: int) -> bytes:
        return dump({"timestamp": ts, "identity": self.identity, "token": self.token})

    # -- fencing ------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: must not block."""
        if state == KazooState.SUSPENDED:
            self._suspended_at = self.monotonic()
            log.warning("%s: ZooKeeper connection suspended; generation stops until the "
                        "lease is confirmed", self.identity)
        elif state == KazooState.LOST:
            self._fence("ZooKeeper session lost: the lease node is gone")

    def _check_live(self) -> None:
        client = self.client
        lease = self._lease
        wid = lease.worker_id if lease else -1
        if client is None:
            raise WorkerIdUnavailable(f"{self.identity}: worker {wid}: not connected")
        if client.state != KazooState.CONNECTED:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {wid}: ZooKeeper connection {client.state}; "
                "self-fenced until the lease is confirmed"
            )
        current = client.client_id[0] if client.client_id else None
        if current != self._session_id:
            self._fence("the ZooKeeper session changed (the old one expired)")
            self.check()
        if self._suspended_at is not None and self._suspended_at >= self._last_ok:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {wid}: connection was suspended; self-fenced "
                "until the next renew succeeds"
            )
        age = self.monotonic() - self._last_ok
        if age > self.fence_after_s:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {wid}: lease not renewed for {age:.1f}s (limit "
                f"{self.fence_after_s:.1f}s); self-fenced"
            )

    # -- writes -------------------------------------------------------------------------

    def _write_hw(self, lease: Lease, ts: int) -> None:
        """Transaction: the lease node exists and the mark is still at our version."""
        client = self.client
        if client is None:
            raise WorkerIdUnavailable(f"{self.identity}: not connected")
        for _ in range(2):
            sent = self.monotonic()
            tx = client.transaction()
            tx.check(self.lease_path(lease.worker_id), version=0)
            tx.set_data(self.hw_path(lease.worker_id), self._hw_data(ts),
                        version=self._hw_version)
            try:
                results = tx.commit_async().get(timeout=self.op_timeout_s)
            except KAZOO_ERRORS as exc:
                raise BackendUnavailable(
                    f"{self.identity}: worker {lease.worker_id}: ZooKeeper write failed: "
                    f"{exc!r}"
                ) from exc
            lease_ok, hw_result = results[0], results[1]
            if not isinstance(hw_result, Exception) and not isinstance(lease_ok, Exception):
                self._hw_version = hw_result.version
                self._last_ok = sent
                return
            if isinstance(lease_ok, NoNodeError | BadVersionError):
                self._fence(f"lease node {self.lease_path(lease.worker_id)} is gone")
                self.check()
            if isinstance(hw_result, BadVersionError) and self._adopt_own_write(lease):
                continue
            self._fence(f"{self.hw_path(lease.worker_id)} was written by the next holder")
            self.check()
        raise WorkerIdUnavailable(f"{self.identity}: worker {lease.worker_id}: write failed")

    def _adopt_own_write(self, lease: Lease) -> bool:
        """After a timed-out write: if the mark holds our token, that write landed."""
        assert self.client is not None
        try:
            raw, stat = self.client.get_async(self.hw_path(lease.worker_id)).get(
                timeout=self.op_timeout_s)
        except KAZOO_ERRORS:
            return False
        if load(raw).get("token") == self.token:
            self._hw_version = stat.version
            return True
        return False

    def _record(self, lease: Lease, ms: int) -> None:
        self._write_hw(lease, ms)

    def _tick(self, lease: Lease) -> None:
        """Renew: a versioned write proves the session and the lease are ours."""
        client = self.client
        if client is None or client.state != KazooState.CONNECTED:
            return
        ts = max(self.clock(), self._high_water)
        try:
            self._write_hw(lease, ts)
        except BackendUnavailable as exc:
            log.warning("%s: renew failed: %s", self.identity, exc)
            return
        self._high_water = ts
        self._write_cache(lease.worker_id, ts)

    def _release(self, lease: Lease, final_ms: int) -> None:
        client = self.client
        if client is None or client.state != KazooState.CONNECTED:
            return
        try:
            self._write_hw(lease, final_ms)
            client.delete_async(self.lease_path(lease.worker_id)).get(timeout=self.op_timeout_s)
        except RELEASE_ERRORS as exc:
            log.warning("%s: release of worker %d failed: %r", self.identity,
                        lease.worker_id, exc)

    def _close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.client.remove_listener(self._on_state)
        close(self.client)
        self.client = None
