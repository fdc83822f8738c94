"""Mode ``zk``: Leaf's ZooKeeper holder (``SnowflakeZookeeperHolder``), made safe.

Leaf's layout, so an existing Leaf tree is shared without conflict::

    /snowflake/{name}/forever/{identity}-0000000007   persistent sequential: the
        sequence number is the worker ID, the identity's for ever; Leaf's Endpoint
        {"ip", "port", "timestamp"} plus our "token"
    /snowflake/{name}/temporary/{identity}            ephemeral: the identity is live;
        the same data plus "pid"
    /snowflake/{name}/layout                          persistent: the DC layout the tree
        serves, {"dc_id", "dc_count", "first", "last"} (docs/design.md §12.1)

With more than one DC (``LEAFPOOL_DC_COUNT``) the worker ID is the DC's first worker ID
plus the sequence number, and a sequence beyond the DC's range is refused; with one DC
(the default) it is the sequence number, as in Leaf.

The start (the live identity, the clock against the live peers', the forever node),
ZooKeeper as a weak dependency and the fencing of a second live process of one identity:
docs/design.md §8.2.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable, ConfigurationError, WorkerIdUnavailable
from leafpool.snowflake.registry.base import HOT_WRITE_SECONDS, Lease, Start
from leafpool.snowflake.registry.cache import CacheRecord
from leafpool.snowflake.registry.zk_common import (
    KAZOO_ERRORS,
    SessionInfo,
    ZooKeeperRegistry,
    close,
    load,
    timestamp_of,
)

log = logging.getLogger(__name__)


class IdentityHeld(WorkerIdUnavailable):
    """The identity's ``temporary`` node ``path`` is held by another live process;
    ``holder`` names its process (when the node says) and session."""

    def __init__(self, identity: str, path: str, data: dict[str, Any], stat: ZnodeStat) -> None:
        pid = data.get("pid")
        who = f"pid {pid} on {data.get('ip', '?')}, " if pid else ""
        self.holder = f"{who}ZooKeeper session 0x{stat.ephemeralOwner:x}"
        super().__init__(
            f"{identity}: identity in use: {path} is held by {self.holder}; two processes "
            "must not share an identity (it waits until that session ends)"
        )


class ZkRegistry(ZooKeeperRegistry):
    mode = "zk"

    def __init__(self, settings: Settings, identity: str, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        self.forever = f"/snowflake/{self.name}/forever"
        self.temporary = f"/snowflake/{self.name}/temporary"
        self.temp_path = f"{self.temporary}/{self.safe_identity}"
        self.node_path: str | None = None  # our forever node
        self.peer_skew_ms: float | None = None
        self.pending_sync = False  # high-water written to the cache only (ZK unreachable)
        self._sessions: set[int] = set()  # sessions this registry created its node in

    # -- claim --------------------------------------------------------------------------

    def _claim_with(self, client: KazooClient, cached: CacheRecord | None) -> Start:
        own_stat, sent = self._hold_identity(client, cached)
        self._check_peers(client, own_stat, sent)
        worker_id, path = self._find_forever(client) or self._create_forever(client)
        raw, stat = client.get(path)
        where = f"ZooKeeper {path}"
        start = self._start(worker_id, timestamp_of(raw), where, cached, "zookeeper")
        try:
            stat = client.set(path, self._data(start.mark), version=stat.version)
        except BadVersionError as exc:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {worker_id} ({path}) was written by another "
                "process while claiming it; two processes share this identity"
            ) from exc
        self._version, self.node_path = stat.version, path
        return start

    def _hold_identity(
        self, client: KazooClient, cached: CacheRecord | None
    ) -> tuple[ZnodeStat, int]:
        """Create our ephemeral ``temporary`` node, or report our clock on it while our
        session holds it. A node of an earlier session of ours, or of this identity's
        previous process (gone), is taken over; another live holder raises
        :class:`IdentityHeld`. Returns the node's stat and our clock when we wrote it."""
        for _ in range(3):
            sent = self.clock()
            marker = self._data(sent, pid=os.getpid())
            try:
                raw, stat = self._wait(client.get_async(self.temp_path))
            except NoNodeError:
                try:
                    created = client.create_async(
                        self.temp_path, marker, ephemeral=True, makepath=True, include_data=True
                    )
                    _, stat = self._wait(created)
                except NodeExistsError:
                    continue  # another session created it meanwhile: whose is it?
                self._sessions.add(stat.ephemeralOwner)
                return stat, sent
            if client.client_id and stat.ephemeralOwner == client.client_id[0]:
                return self._wait(client.set_async(self.temp_path, marker, stat.version)), sent
            holder = load(raw)
            pid = holder.get("pid")
            if stat.ephemeralOwner in self._sessions:
                what = "this process's own node from an earlier session"
            elif cached is not None and cached.left_by_gone_writer(holder.get("token"), pid):
                what = f"this identity's previous process (pid {pid or '?'}, gone)"
            else:
                raise IdentityHeld(self.identity, self.temp_path, holder, stat)
            log.warning(
                "%s: taking over %s from %s (session 0x%x)",
                self.identity,
                self.temp_path,
                what,
                stat.ephemeralOwner,
            )
            with contextlib.suppress(NoNodeError, BadVersionError):
                self._wait(client.delete_async(self.temp_path, version=stat.version))
        raise WorkerIdUnavailable(f"{self.identity}: could not create {self.temp_path}")

    def _check_peers(self, client: KazooClient, own: ZnodeStat, sent: int) -> None:
        """Refuse when our clock differs from the live peers' by more than allowed."""
        ours = sent - own.mtime
        names = [c for c in client.get_children(self.temporary) if c != self.safe_identity]
        pending = [client.get_async(f"{self.temporary}/{n}") for n in names]
        skews: list[int] = []
        for result in pending:
            try:
                raw, stat = self._wait(result)
            except NoNodeError:
                continue
            if (reported := timestamp_of(raw)) > 0:
                skews.append(ours - (reported - stat.mtime))
        if not skews:
            log.info("%s: no live peers to compare the clock with", self.identity)
            return
        mean = self.peer_skew_ms = sum(skews) / len(skews)
        limit = self.settings.snowflake_peer_skew_ms
        if abs(mean) > limit:
            raise WorkerIdUnavailable(
                f"{self.identity}: the local clock differs from the {len(skews)} live peers' "
                f"by {mean:+.0f} ms on average, more than LEAFPOOL_SNOWFLAKE_PEER_SKEW_MS="
                f"{limit}; refusing to start (fix the clock)"
            )
        log.info("%s: clock within %+.0f ms of %d live peers", self.identity, mean, len(skews))

    def _find_forever(self, client: KazooClient) -> tuple[int, str] | None:
        client.ensure_path(self.forever)
        mine = []
        for child in client.get_children(self.forever):
            name, sep, seq = child.rpartition("-")
            if sep and name == self.safe_identity and seq.isdigit():
                mine.append((int(seq), f"{self.forever}/{child}"))
        if not mine:
            return None
        seq, path = min(mine)
        if len(mine) > 1:
            log.warning(
                "%s: %d forever nodes; using the lowest, %s", self.identity, len(mine), path
            )
        if seq >= self.dc.size:
            raise WorkerIdUnavailable(
                f"{self.identity}: its forever node {path} has sequence {seq}, beyond the "
                f"{self.dc.size} worker IDs of {self.dc.describe()}; remove it or use mode "
                "zk_recycle"
            )
        return self.dc.first + seq, path

    def _create_forever(self, client: KazooClient) -> tuple[int, str]:
        prefix = f"{self.forever}/{self.safe_identity}-"
        path = client.create(prefix, self._data(self.clock()), sequence=True)
        seq = int(path.rpartition("-")[2])
        if seq >= self.dc.size:
            with contextlib.suppress(*KAZOO_ERRORS):
                client.delete(path)
            raise WorkerIdUnavailable(
                f"{self.identity}: ZooKeeper's sequence under {self.forever} reached {seq}: "
                f"{self.dc.describe()} has {self.dc.size} worker IDs (LEAFPOOL_DC_COUNT="
                f"{self.dc.dc_count}) and mode zk never reuses one (use mode zk_recycle, or "
                "a new LEAFPOOL_SNOWFLAKE_NAME)"
            )
        log.info("%s: new forever node %s", self.identity, path)
        return self.dc.first + seq, path

    # -- running ------------------------------------------------------------------------

    def _write_forever(self, client: KazooClient, ts: int, timeout_s: float | None = None
                       ) -> bool:
        """Versioned write of the forever node. False when ZooKeeper did not answer;
        fences (and raises) when another process wrote it."""
        path = self.node_path
        assert path is not None

        def write() -> ZnodeStat:
            return self._wait(client.set_async(path, self._data(ts), version=self._version),
                              timeout_s)

        try:
            self._write_versioned(path, write, "another process", timeout_s)
        except KAZOO_ERRORS as exc:
            log.warning(
                "%s: writing %s failed (%r); kept in the cache file", self.identity, path, exc
            )
            return False
        return True

    def _write_mark(self, lease: Lease, ms: int) -> None:
        """A record: the forever node within :data:`HOT_WRITE_SECONDS`, else the cache
        file alone until the tick syncs it (ZooKeeper is a weak dependency here)."""
        client = self._connected()
        timeout = min(self.op_timeout_s, HOT_WRITE_SECONDS)
        if client is None or not self._write_forever(client, ms, timeout):
            self._cache_only(lease.worker_id, ms)

    def _cache_stands_in(self) -> bool:
        """Once a record found ZooKeeper unreachable (or a tick could not sync), the
        cache file alone takes the records until a tick syncs the mark: a record waits
        for no stalled server."""
        if self._connected() is None:
            self.pending_sync = True
        return self.pending_sync

    def _source_busy(self, ms: int) -> None:
        """A tick's write to a stalled ZooKeeper holds the source: the cache file."""
        with self._io:
            self.check()
            lease = self.lease
            assert lease is not None
            self._cache_only(lease.worker_id, ms)
            self._raise_high_water(ms)

    def _cache_only(self, worker_id: int, ms: int) -> None:
        if not self.pending_sync:
            log.warning(
                "%s: worker %d: high-water %d recorded in the cache file only "
                "(ZooKeeper unreachable; synced when it answers)",
                self.identity,
                worker_id,
                ms,
            )
        self.pending_sync = True

    def tick(self) -> None:
        """Started from the cache: try ZooKeeper again first. The connect attempt runs
        without the registry's lock, so record_high_water never waits for it."""
        lease = self.lease
        if lease is not None and self.fenced is None and self.degraded:
            with contextlib.suppress(BackendUnavailable):  # still unreachable: next tick
                client, info = self._connect(min(2.0, self.connect_timeout_s))
                with self._source, self._io:
                    if self.lease is lease and self.degraded:
                        self._reconnect(lease, client, info)
                    else:
                        close(client)
        super().tick()

    def _renew(self, lease: Lease, ms: int) -> bool:
        """Report our clock on the ephemeral node (first: is the identity still ours?),
        then the mark on the forever node; the cache file holds it either way."""
        client = self._connected()
        if client is None:
            return True
        try:
            self._hold_identity(client, None)
        except IdentityHeld as exc:
            self._fence(f"identity held by {exc.holder}")
            return False  # nothing more is written
        except (WorkerIdUnavailable, *KAZOO_ERRORS) as exc:  # the next tick tries again
            log.warning("%s: report to %s failed: %r", self.identity, self.temp_path, exc)
        # synced: records go to ZooKeeper again; not: to the cache file alone until a
        # tick syncs (a stalled server would hold up every record otherwise)
        self.pending_sync = not self._write_forever(client, ms)
        return True

    def _reconnect(self, lease: Lease, client: KazooClient, info: SessionInfo) -> None:
        """Started from the cache: ZooKeeper answers again. Check that no other live
        process holds the identity (else fence) and that ZooKeeper agrees on the worker
        ID; the tick then syncs the high-water mark."""
        try:
            self._check_layout(client)
            self._hold_identity(client, self.read_cache())
            found = self._find_forever(client)
            if found is None or found[0] != lease.worker_id:
                self._fence(
                    f"ZooKeeper has worker {found[0] if found else None} for this identity, "
                    f"but this process started from the cache file with {lease.worker_id}"
                )
            else:
                raw, stat = client.get(found[1])
                self._version, self.node_path = stat.version, found[1]
                self.client, self.session, self.degraded = client, info, False
                self.high_water_ms = max(self.high_water_ms, timestamp_of(raw))
                log.info(
                    "%s: ZooKeeper reachable again; worker %d confirmed",
                    self.identity,
                    lease.worker_id,
                )
                return
        except IdentityHeld as exc:
            self._fence(f"identity held by {exc.holder}")
        except ConfigurationError as exc:  # the tree serves another DC layout
            self._fence(str(exc))
        except (WorkerIdUnavailable, *KAZOO_ERRORS) as exc:
            log.warning("%s: reconnecting to ZooKeeper failed: %s", self.identity, exc)
        close(client)

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        client = self._connected()
        if client is None:
            return
        try:
            self._write_forever(client, final_ms)
            self._wait(client.delete_async(self.temp_path))
        except KAZOO_ERRORS as exc:
            log.warning("%s: release in ZooKeeper failed: %r", self.identity, exc)

    def _close(self) -> None:
        super()._close()
        self.node_path = None
