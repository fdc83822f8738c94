"""Mode ``k8s``: the worker ID of a StatefulSet pod is its DC's first worker ID (0 with one
DC; docs/design.md §12.1) plus ``LEAFPOOL_SNOWFLAKE_WORKER_OFFSET`` plus its pod index
(``LEAFPOOL_SNOWFLAKE_POD_INDEX``, set from the ``apps.kubernetes.io/pod-index`` label
through the downward API; unset: the trailing ordinal of ``HOSTNAME``,
``leafpool-snowflake-2`` is 2), held under the ``zk_recycle`` lease of that one worker ID
(docs/design.md §8.6).

The worker ID is fixed, so the lease does not choose it: it only says *when* this pod
may use it. A replacement pod (the old one force-deleted, or partitioned and still
running) finds the lease node of its predecessor's session and is refused until that
session has expired; the predecessor fences itself before that (it stops generating,
its readiness file goes). The high-water mark is the persistent ``recycle/hw/NNNN`` node,
outside the pod: no PersistentVolume is needed. Leases and marks are ``zk_recycle``'s
nodes, so a ``zk_recycle`` process never takes a pod's worker ID while it runs either.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from leafpool.core.config import Settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import MAX_WORKER_ID
from leafpool.snowflake.registry.base import Start
from leafpool.snowflake.registry.cache import CacheRecord
from leafpool.snowflake.registry.layout import settings_range
from leafpool.snowflake.registry.recycle import RecycleRegistry
from leafpool.snowflake.registry.zk_common import load

log = logging.getLogger(__name__)

POD_INDEX_ENV = "LEAFPOOL_SNOWFLAKE_POD_INDEX"
OFFSET_ENV = "LEAFPOOL_SNOWFLAKE_WORKER_OFFSET"
_ORDINAL = re.compile(r"-(\d+)$")


def pod_index(settings: Settings, hostname: str) -> int:
    """The pod index: the setting, else ``hostname``'s trailing ``-N``."""
    if settings.snowflake_pod_index is not None:
        return settings.snowflake_pod_index
    found = _ORDINAL.search(hostname)
    if found is None:
        raise ConfigurationError(
            POD_INDEX_ENV, "",
            f"unset, and HOSTNAME {hostname!r} does not end in a StatefulSet ordinal (-N): "
            "set it from the apps.kubernetes.io/pod-index label (downward API), or run "
            "the snowflake workers as a StatefulSet")
    return int(found[1])


def pod_worker_id(settings: Settings, hostname: str) -> int:
    """The DC's first worker ID + ``LEAFPOOL_SNOWFLAKE_WORKER_OFFSET`` + the pod index,
    within the DC's range (docs/design.md §12.1; one DC: offset + index within 0..1023).
    The offset is relative to the DC's range, so every DC runs the same manifest but
    for ``LEAFPOOL_DC_ID``, and no offset reaches another DC's worker IDs."""
    index = pod_index(settings, hostname)
    dc = settings_range(settings)
    worker_id = dc.first + settings.snowflake_worker_offset + index
    if worker_id > dc.last:
        where = f"of {dc.describe()}" if dc.dc_count > 1 else ""
        raise ConfigurationError(
            OFFSET_ENV, settings.snowflake_worker_offset,
            f"plus the pod index {index} is {worker_id - dc.first}, beyond the "
            f"{dc.size} worker IDs {where or f'(0..{MAX_WORKER_ID})'} (worker ID "
            f"{worker_id}): lower the offset or the StatefulSet's replicas")
    return worker_id


def this_hostname() -> str:
    return os.environ.get("HOSTNAME") or socket.gethostname()


class K8sRegistry(RecycleRegistry):
    mode = "k8s"
    leased = True

    def __init__(
        self, settings: Settings, identity: str, *, hostname: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(settings, identity, **kwargs)
        self.hostname = hostname or this_hostname()
        self.pod_worker_id = pod_worker_id(settings, self.hostname)  # refused early

    def _claim_with(self, client: KazooClient, cached: CacheRecord | None) -> Start:
        """Take the lease of this pod's worker ID, or refuse while another session
        holds it; then the mark, as zk_recycle does."""
        self._prepare(client)
        worker_id = self.pod_worker_id
        self._take_lease(client, worker_id)
        self._session_id = client.client_id[0] if client.client_id else None
        return self._raise_mark(client, worker_id, cached)

    def _origin(self, worker_id: int) -> str:
        offset = self.settings.snowflake_worker_offset
        index = worker_id - self.dc.first - offset
        if self.dc.dc_count == 1:
            return f"offset {offset} + pod index {index}"
        return f"DC {self.dc.dc_id}'s first {self.dc.first} + offset {offset} + pod index {index}"

    def _take_lease(self, client: KazooClient, worker_id: int) -> None:
        path = self.lease_path(worker_id)
        try:
            client.create(path, self._data(self.clock(), identity=self.identity), ephemeral=True)
        except NodeExistsError:
            try:
                raw, stat = client.get(path)
                holder = load(raw).get("identity", "?")
                owner = f"session 0x{stat.ephemeralOwner:x}"
            except NoNodeError:  # gone meanwhile: the next attempt may take it
                holder, owner = "?", "a session that just ended"
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {worker_id} ({self._origin(worker_id)}) is leased by "
                f"{holder} ({owner}); this pod waits until that lease is released or "
                f"expires (the ZooKeeper session timeout) and never generates meanwhile"
            ) from None
        log.info("%s: leased worker %d (pod %s)", self.identity, worker_id, self.hostname)
