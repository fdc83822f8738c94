"""Mode ``zk_recycle``: worker IDs of the DC's range (0..1023 with one DC; docs/design.md
§12.1) leased from ZooKeeper and reclaimed when their holder's session ends (NotFound9's
mode of the same name, for hosts and ports that come and go).

The lease is the ephemeral ``/snowflake/{name}/recycle/lease/0007``, held by the
holder's session; the mark the persistent ``recycle/hw/0007`` (its ``timestamp``), which
outlives every holder. Why a former holder's write never lands after the next holder
read the mark, and why the holder stops before anyone else can get its worker ID:
docs/design.md §8.3.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState, ZnodeStat

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable, WorkerIdUnavailable
from leafpool.snowflake.registry import layout
from leafpool.snowflake.registry.base import HOT_WRITE_SECONDS, Lease, Start
from leafpool.snowflake.registry.cache import CacheRecord
from leafpool.snowflake.registry.zk_common import (
    KAZOO_ERRORS,
    ZooKeeperRegistry,
    dump,
    timestamp_of,
)

log = logging.getLogger(__name__)


class RecycleRegistry(ZooKeeperRegistry):
    mode = "zk_recycle"
    leased = True

    def __init__(self, settings: Settings, identity: str, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        self.lease_dir = f"/snowflake/{self.name}/recycle/lease"
        self.hw_dir = f"/snowflake/{self.name}/recycle/hw"
        self._session_id: int | None = None  # the session holding our lease node

    def lease_path(self, worker_id: int) -> str:
        return f"{self.lease_dir}/{worker_id:04d}"

    def hw_path(self, worker_id: int) -> str:
        return f"{self.hw_dir}/{worker_id:04d}"

    # -- claim --------------------------------------------------------------------------

    def _unreachable(self, exc: BackendUnavailable, cached: CacheRecord | None) -> Start:
        raise WorkerIdUnavailable(
            f"{self.identity}: ZooKeeper unreachable ({exc}); in mode zk_recycle a "
            "worker ID is a lease held by a ZooKeeper session, so the cache file "
            "cannot stand in for it"
        ) from exc

    def _prepare(self, client: KazooClient) -> None:
        """Before a claim: the lease is the session ZooKeeper granted; watch its state."""
        assert self.session is not None
        self.deadline.lease_s = self.session.timeout_s
        client.add_listener(self._on_state)
        client.ensure_path(self.lease_dir)
        client.ensure_path(self.hw_dir)

    def _claim_with(self, client: KazooClient, cached: CacheRecord | None) -> Start:
        """Create the first free lease node, this identity's previous worker ID first."""
        self._prepare(client)
        taken = {int(c) for c in client.get_children(self.lease_dir) if c.isdigit()}
        previous = cached.worker_id if cached is not None else -1
        free = sorted(set(self.dc.ids()) - taken, key=lambda w: (w != previous, w))
        for worker_id in free:
            try:
                client.create(
                    self.lease_path(worker_id),
                    self._data(self.clock(), identity=self.identity),
                    ephemeral=True,
                )
            except NodeExistsError:
                continue
            self._session_id = client.client_id[0] if client.client_id else None
            return self._raise_mark(client, worker_id, cached)
        raise layout.exhausted(self.identity, self.dc, f"leased under {self.lease_dir}")

    def _raise_mark(self, client: KazooClient, worker_id: int, cached: CacheRecord | None) -> Start:
        """Raise the worker ID's mark to the start mark, at the version we read: a former
        holder's late write in between makes us read the mark again."""
        path = self.hw_path(worker_id)
        for _ in range(10):
            try:
                raw, stat = client.get(path)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    client.create(path, dump({"timestamp": 0}))
                continue
            where = f"ZooKeeper {path}"
            start = self._start(worker_id, timestamp_of(raw), where, cached, "zookeeper")
            try:
                with self.deadline.renewing():
                    stat = client.set(
                        path, self._data(start.mark, identity=self.identity), version=stat.version
                    )
            except BadVersionError:
                continue
            self._version = stat.version
            return start
        raise WorkerIdUnavailable(f"{self.identity}: {path} keeps changing; not claimed")

    # -- fencing ------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: must not block."""
        if state == KazooState.SUSPENDED:
            log.warning("%s: ZooKeeper connection suspended; generating on the lease, which "
                        "runs until %d", self.identity, self.deadline.until_wall)
        elif state == KazooState.LOST:
            self._fence("ZooKeeper session lost: the lease node is gone")

    def _check_live(self, who: str) -> None:
        """Fenced once the session is lost or changed; then the lease deadline. A
        SUSPENDED connection does not stop generation: the session (the lease) outlives
        the deadline, and every record beyond the mark the node holds needs a write
        (docs/design.md §8.3)."""
        client = self.client
        if client is None:
            raise WorkerIdUnavailable(f"{who}: not connected")
        if client.client_id is not None and client.client_id[0] != self._session_id:
            self._fence("the ZooKeeper session changed (the old one expired)")
            self.check()
        self.deadline.check(who)

    # -- writes -------------------------------------------------------------------------

    def _write_mark(self, lease: Lease, ms: int) -> None:
        """A record beyond the mark the node holds, within :data:`HOT_WRITE_SECONDS`;
        ZooKeeper not connected: :class:`BackendUnavailable` at once."""
        client = self._connected()
        if client is None:
            state = self.client.state if self.client is not None else "closed"
            raise BackendUnavailable(
                f"{self.identity}: worker {lease.worker_id}: high-water {ms} not recorded: "
                f"ZooKeeper connection {state}")
        self._write_tx(client, lease, ms, min(self.op_timeout_s, HOT_WRITE_SECONDS))

    def _write_tx(self, client: KazooClient, lease: Lease, ms: int, timeout_s: float) -> None:
        """One transaction: our lease node exists and the mark is still at our version."""
        lease_path, hw_path = self.lease_path(lease.worker_id), self.hw_path(lease.worker_id)

        def write() -> ZnodeStat:
            tx = client.transaction()
            tx.check(lease_path, version=0)
            tx.set_data(hw_path, self._data(ms, identity=self.identity), version=self._version)
            with self.deadline.renewing():
                try:
                    lease_ok, hw = self._wait(tx.commit_async(), timeout_s)
                except KAZOO_ERRORS as exc:
                    raise BackendUnavailable(
                        f"{self.identity}: worker {lease.worker_id}: ZooKeeper write failed: "
                        f"{exc!r}"
                    ) from exc
                if isinstance(lease_ok, NoNodeError | BadVersionError):
                    self._fence(f"lease node {lease_path} is gone")
                    self.check()
                if isinstance(hw, Exception):  # BadVersion, or the node gone: not ours
                    raise hw if isinstance(hw, BadVersionError) else BadVersionError(repr(hw))
            return hw

        self._write_versioned(hw_path, write, "the next holder", timeout_s)

    def _renew(self, lease: Lease, ms: int) -> bool:
        """A versioned write proves the session and the lease are ours."""
        client = self._connected()
        if client is None:
            return False
        self._write_tx(client, lease, ms, self.op_timeout_s)
        return True

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        try:
            if self._renew(lease, final_ms):  # only while connected
                assert self.client is not None
                self._wait(self.client.delete_async(self.lease_path(lease.worker_id)))
        except (WorkerIdUnavailable, BackendUnavailable, *KAZOO_ERRORS) as exc:
            log.warning("%s: release of worker %d failed: %r", self.identity, lease.worker_id, exc)

    def _close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.client.remove_listener(self._on_state)
        super()._close()
