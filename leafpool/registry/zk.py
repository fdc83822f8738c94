"""Mode ``zk``: Leaf's ZooKeeper holder (``SnowflakeZookeeperHolder``), made safe.

Layout (Leaf's, so an existing Leaf tree is shared without conflict)::

    /snowflake/{name}/forever/{identity}-0000000007   persistent sequential; the
        sequence number is the worker ID, reused by the same identity after a restart.
        Data: Leaf's Endpoint JSON {"ip", "port", "timestamp"} plus our "token".
    /snowflake/{name}/temporary/{identity}            ephemeral (the article's
        leaf_temporary): marks the identity live; data {"ip", "port", "timestamp", "token",
        "pid"}

The identity is written in its safe form (no ``-``, which Leaf splits child names on).
``timestamp`` is reported every ``snowflake_report_seconds`` (Leaf: 3 s) and raised by
:meth:`record_high_water`; every write of the forever node is conditional on the znode
version this process last wrote, so a second process that claimed the same identity
fences the first.

Start (:meth:`claim`):

1. create the ephemeral ``temporary`` node; if a live session holds it, the identity
   is in use and the start is refused (unless the holder is this host's previous
   incarnation of the identity: same token as the cache file);
2. compare the local clock with the live peers': each peer's offset to ZooKeeper's
   clock is its reported timestamp minus the node's ``mtime``; ours is measured the same
   way on our own node. The mean difference must stay within
   ``snowflake_peer_skew_ms`` (Leaf's article describes this check; Leaf never shipped
   it);
3. find or create the forever node; more than 1024 sequence numbers means no worker ID
   is left (never wrapped);
4. refuse when the local clock is behind the recorded timestamp (the node's or the
   cache file's, whichever is larger).

ZooKeeper is a weak dependency here, as in Leaf: the worker ID belongs to the identity
for ever, so when ZooKeeper is unreachable at start the cache file supplies it (same
clock check), and while it is unreachable the high-water mark is written to the cache
file and synced to ZooKeeper once it answers again.

One identity, one live process: a process that finds its ``temporary`` node held by
another live session once ZooKeeper answers again (started from the cache file, or its
session expired and the node is not its own) is **fenced**: it stops generating for good
(the pool keeps serving what it holds), logs it and reports ``fenced: identity held by
...`` as the tag's lease state. The holder is told apart from this identity's previous,
dead incarnation by the token and pid in the node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState, ZnodeStat

from leafpool.config import Settings
from leafpool.errors import BackendUnavailable, WorkerIdUnavailable
from leafpool.registry.base import Lease, Start
from leafpool.registry.cache import CacheRecord
from leafpool.registry.zk_common import (
    KAZOO_ERRORS,
    SessionInfo,
    ZooKeeperRegistry,
    close,
    dump,
    load,
    timestamp_of,
)
from leafpool.snowflake import MAX_WORKER_ID

log = logging.getLogger(__name__)

RECONNECT_ERRORS: tuple[type[BaseException], ...] = (WorkerIdUnavailable, *KAZOO_ERRORS)


class IdentityHeld(WorkerIdUnavailable):
    """The identity's ``temporary`` node is held by another live process."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def describe_holder(data: dict[str, Any], stat: ZnodeStat) -> str:
    """Who holds a ``temporary`` node: its process (when it says) and session."""
    pid = data.get("pid")
    who = f"pid {pid} on {data.get('ip', '?')}, " if pid else ""
    return f"{who}ZooKeeper session 0x{stat.ephemeralOwner:x}"


class ZkRegistry(ZooKeeperRegistry):
    mode = "zk"

    def __init__(self, settings: Settings, identity: str, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        self.root = f"/snowflake/{self.name}"
        self.forever = f"{self.root}/forever"
        self.temporary = f"{self.root}/temporary"
        self.temp_path = f"{self.temporary}/{self.safe_identity}"
        self.op_timeout_s = min(10.0, settings.snowflake_lease_seconds)
        self.node_path: str | None = None
        self.peer_skew_ms: float | None = None
        self.pending_sync = False  # high-water written to the cache only (ZK unreachable)
        self._sessions: set[int] = set()  # sessions this registry created its node in

    @property
    def degraded(self) -> bool:
        """True while running without ZooKeeper (started from the cache file)."""
        return self.node_path is None

    # -- claim --------------------------------------------------------------------------

    def _unreachable(self, exc: BackendUnavailable, cached: CacheRecord | None) -> Start:
        self.node_path = None
        return self._cached_start(f"ZooKeeper unreachable ({exc})", exc, cached)

    def _claim_with(self, client: KazooClient, cached: CacheRecord | None) -> Start:
        own_stat, sent = self._join(client, cached)
        self._check_peers(client, own_stat, sent)
        worker_id, path = self._find_forever(client) or self._create_forever(client)
        raw, stat = client.get(path)
        start = self._start(worker_id, timestamp_of(load(raw)), f"ZooKeeper {path}", cached,
                            "zookeeper")
        try:
            stat = client.set(path, self._endpoint(start.mark), version=stat.version)
        except BadVersionError as exc:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {worker_id} ({path}) was written by another "
                "process while claiming it; two processes share this identity"
            ) from exc
        self._version = stat.version
        self.node_path = path
        return start

    def _endpoint(self, ts: int) -> bytes:
        return dump({"ip": self.host, "port": self.rest, "timestamp": ts, "token": self.token})

    def _live_marker(self, ts: int) -> bytes:
        """Data of the ``temporary`` node: the endpoint plus this process's pid."""
        return dump({"ip": self.host, "port": self.rest, "timestamp": ts, "token": self.token,
                     "pid": os.getpid()})

    def _previous_incarnation(self, holder: dict[str, Any], cached: CacheRecord | None
                              ) -> bool:
        """True when a held ``temporary`` node is this identity's previous process, now
        gone (its token is the cache file's, its pid runs no more): it may be taken over.
        Any other holder is another live process."""
        if cached is None or not cached.token or holder.get("token") != cached.token:
            return False
        pid = holder.get("pid")
        writer = cached if not isinstance(pid, int) else dataclasses.replace(cached, pid=pid)
        return writer.writer_gone()

    def _join(self, client: KazooClient, cached: CacheRecord | None) -> tuple[ZnodeStat, int]:
        """Create our ephemeral ``temporary`` node (:class:`IdentityHeld` when another
        live process holds it); returns its stat and our clock when we sent it."""
        client.ensure_path(self.forever)
        client.ensure_path(self.temporary)
        for _ in range(3):
            sent = self.clock()
            try:
                _, stat = client.create(self.temp_path, self._live_marker(sent),
                                        ephemeral=True, include_data=True)
                self._sessions.add(stat.ephemeralOwner)
                return stat, sent
            except NodeExistsError:
                pass
            try:
                raw, ostat = client.get(self.temp_path)
            except NoNodeError:
                continue
            holder = load(raw)
            if ostat.ephemeralOwner in self._sessions:
                what = "this process's own node from an earlier session"
            elif self._previous_incarnation(holder, cached):
                what = f"this identity's previous process (pid {holder.get('pid', '?')}, gone)"
            else:
                who = describe_holder(holder, ostat)
                raise IdentityHeld(
                    f"{self.identity}: identity in use: {self.temp_path} is held by {who}; "
                    "two processes must not share an identity (it waits until that "
                    "session ends)", who,
                )
            log.warning("%s: taking over %s from %s (session 0x%x)", self.identity,
                        self.temp_path, what, ostat.ephemeralOwner)
            with contextlib.suppress(NoNodeError, BadVersionError):
                client.delete(self.temp_path, version=ostat.version)
        raise WorkerIdUnavailable(f"{self.identity}: could not create {self.temp_path}")

    def _check_peers(self, client: KazooClient, own: ZnodeStat, sent: int) -> None:
        """Refuse when our clock differs from the live peers' by more than allowed."""
        ours = sent - own.mtime
        names = [c for c in client.get_children(self.temporary) if c != self.safe_identity]
        pending = [(n, client.get_async(f"{self.temporary}/{n}")) for n in names]
        skews: list[int] = []
        for _, result in pending:
            try:
                raw, stat = result.get(timeout=self.op_timeout_s)
            except NoNodeError:
                continue
            reported = timestamp_of(load(raw))
            if reported > 0:
                skews.append(ours - (reported - stat.mtime))
        if not skews:
            log.info("%s: no live peers to compare the clock with", self.identity)
            return
        mean = sum(skews) / len(skews)
        self.peer_skew_ms = mean
        limit = self.settings.snowflake_peer_skew_ms
        if abs(mean) > limit:
            raise WorkerIdUnavailable(
                f"{self.identity}: the local clock differs from the {len(skews)} live peers' "
                f"by {mean:+.0f} ms on average, more than LEAFPOOL_SNOWFLAKE_PEER_SKEW_MS="
                f"{limit}; refusing to start (fix the clock)"
            )
        log.info("%s: clock within %+.0f ms of %d live peers", self.identity, mean, len(skews))

    def _find_forever(self, client: KazooClient) -> tuple[int, str] | None:
        mine = []
        for child in client.get_children(self.forever):
            name, sep, seq = child.rpartition("-")
            if sep and name == self.safe_identity and seq.isdigit():
                mine.append((int(seq), f"{self.forever}/{child}"))
        if not mine:
            return None
        mine.sort()
        if len(mine) > 1:
            log.warning("%s: %d forever nodes for this identity; using the lowest, %s",
                        self.identity, len(mine), mine[0][1])
        worker_id, path = mine[0]
        if worker_id > MAX_WORKER_ID:
            raise WorkerIdUnavailable(
                f"{self.identity}: its forever node {path} has sequence {worker_id}, above "
                f"{MAX_WORKER_ID}; remove it or use mode zk_recycle"
            )
        return worker_id, path

    def _create_forever(self, client: KazooClient) -> tuple[int, str]:
        path = client.create(f"{self.forever}/{self.safe_identity}-",
                             self._endpoint(self.clock()), sequence=True)
        worker_id = int(path.rpartition("-")[2])
        if worker_id > MAX_WORKER_ID:
            with contextlib.suppress(*KAZOO_ERRORS):
                client.delete(path)
            raise WorkerIdUnavailable(
                f"{self.identity}: ZooKeeper's sequence under {self.forever} reached "
                f"{worker_id}; worker IDs are 0..{MAX_WORKER_ID} and mode zk never reuses "
                "one (use mode zk_recycle, or a new LEAFPOOL_SNOWFLAKE_NAME)"
            )
        log.info("%s: new forever node %s", self.identity, path)
        return worker_id, path

    # -- running ------------------------------------------------------------------------

    def _connected(self) -> KazooClient | None:
        client = self.client
        if client is None or self.node_path is None or client.state != KazooState.CONNECTED:
            return None
        return client

    def _write_forever(self, client: KazooClient, ts: int) -> bool:
        """Versioned write of the forever node. False when ZooKeeper did not answer;
        fences (and raises) when another process wrote it."""
        path = self.node_path
        assert path is not None
        try:
            self._write_versioned(path, lambda: client.set_async(
                path, self._endpoint(ts), version=self._version).get(timeout=self.op_timeout_s),
                "another process")
        except KAZOO_ERRORS as exc:
            log.warning("%s: ZooKeeper write of %s failed (%r); kept in the cache file",
                        self.identity, path, exc)
            return False
        return True

    def _write_mark(self, lease: Lease, ms: int) -> None:
        client = self._connected()
        if client is None or not self._write_forever(client, ms):
            self.pending_sync = True
            log.warning("%s: worker %d: high-water %d recorded in the cache file only "
                        "(ZooKeeper unreachable; synced when it answers)", self.identity,
                        lease.worker_id, ms)

    def tick(self) -> None:
        """Started from the cache: try ZooKeeper again first. The connect attempt runs
        without the registry's lock, so record_high_water never waits for it."""
        lease = self._lease
        if lease is not None and self._fenced is None and self.node_path is None:
            try:
                client, info = self._connect(min(2.0, self.connect_timeout_s))
            except BackendUnavailable:
                pass
            else:
                with self._io:
                    if self._lease is lease and self.node_path is None:
                        self._reconnect(lease, client, info)
                    else:
                        close(client)
        super().tick()

    def _renew(self, lease: Lease, ms: int) -> bool:
        """Report our clock on the ephemeral node (first: is the identity still ours?),
        then the mark on the forever node; the cache file holds it either way."""
        client = self._connected()
        if client is not None:
            self._touch_temporary(client, self.clock())
            if self._fenced is not None:
                return False  # logged by the fence; nothing more is written
            if self._write_forever(client, ms):
                self.pending_sync = False
        return True

    def _touch_temporary(self, client: KazooClient, now: int) -> None:
        """Report our time on the ephemeral node; re-create it after a session expiry.
        A node held by another session fences this process (the identity is in use)."""
        marker = self._live_marker(now)
        for _ in range(2):
            try:
                raw, stat = client.get_async(self.temp_path).get(timeout=self.op_timeout_s)
                current = client.client_id[0] if client.client_id else None
                if stat.ephemeralOwner not in self._sessions and stat.ephemeralOwner != current:
                    self._fence(f"identity held by {describe_holder(load(raw), stat)}")
                    return
                client.set_async(self.temp_path, marker, version=stat.version
                                 ).get(timeout=self.op_timeout_s)
            except NoNodeError:  # gone with an expired session: re-create it in ours
                try:
                    _, stat = client.create_async(self.temp_path, marker, ephemeral=True,
                                                  include_data=True).get(timeout=self.op_timeout_s)
                except NodeExistsError:
                    continue  # another session created it meanwhile: whose is it?
                except KAZOO_ERRORS as exc:
                    log.warning("%s: re-creating %s failed: %r", self.identity, self.temp_path,
                                exc)
                    return  # the next tick tries again
                self._sessions.add(stat.ephemeralOwner)
                log.info("%s: re-created %s (new ZooKeeper session)", self.identity,
                         self.temp_path)
            except KAZOO_ERRORS as exc:  # BadVersionError too: written meanwhile
                log.warning("%s: report to %s failed: %r", self.identity, self.temp_path, exc)
            return

    def _reconnect(self, lease: Lease, client: KazooClient, info: SessionInfo) -> None:
        """Started from the cache: ZooKeeper answers again. Check that no other live
        process holds the identity (else fence) and that ZooKeeper agrees on the worker
        ID; the tick then syncs the high-water mark."""
        try:
            try:
                self._join(client, self.read_cache())
            except IdentityHeld as exc:
                self._fence(f"identity held by {exc.holder}")
                close(client)
                return
            found = self._find_forever(client)
            if found is None or found[0] != lease.worker_id:
                self._fence(
                    f"ZooKeeper has worker {found[0] if found else None} for this identity, "
                    f"but this process started from the cache file with {lease.worker_id}"
                )
                close(client)
                return
            raw, stat = client.get(found[1])
            self._version = stat.version
            self.node_path = found[1]
            self.client, self.session = client, info
            self._high_water = max(self._high_water, timestamp_of(load(raw)))
            log.info("%s: ZooKeeper reachable again; worker %d confirmed", self.identity,
                     lease.worker_id)
        except RECONNECT_ERRORS as exc:
            log.warning("%s: reconnecting to ZooKeeper failed: %s", self.identity, exc)
            self.node_path = None
            close(client)

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        client = self._connected()
        if client is None:
            return
        try:
            self._write_forever(client, final_ms)
            client.delete_async(self.temp_path).get(timeout=self.op_timeout_s)
        except KAZOO_ERRORS as exc:
            log.warning("%s: release in ZooKeeper failed: %r", self.identity, exc)

    def _close(self) -> None:
        super()._close()
        self.node_path = None
