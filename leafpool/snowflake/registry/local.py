"""Mode ``local``: NotFound9's static identity -> worker ID map
(``LEAFPOOL_SNOWFLAKE_LOCAL_MAP``, parsed with the settings: ``identity=worker_id,...``
or one worker ID for every process), or with an empty map the lowest worker ID free on
this host (one host only). A worker ID held is locked on the host; the mark lives in the
cache files (docs/design.md §8.5).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any

from leafpool.core.config import LOCAL_MAP_ENV, Settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import MAX_WORKER_ID
from leafpool.snowflake.registry.base import BaseRegistry, Lease, Start
from leafpool.snowflake.registry.cache import CacheRecord, read_all


class LocalRegistry(BaseRegistry):
    mode = "local"

    def __init__(self, settings: Settings, identity: str, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        self.mapping = settings.local_map  # parsed and validated with the settings
        self._lock_fd: int | None = None

    def worker_id_for_identity(self, cached: CacheRecord | None = None) -> int:
        """The mapped worker ID; with an empty map the lowest free one, locked."""
        if self.mapping is None:
            return self._lowest_free(cached)
        if isinstance(self.mapping, int):
            return self.mapping
        try:
            return self.mapping[self.identity]
        except KeyError:
            raise ConfigurationError(
                LOCAL_MAP_ENV,
                self.settings.snowflake_local_map,
                f"has no entry for this process's identity {self.identity!r}",
            ) from None

    def _lowest_free(self, own: CacheRecord | None) -> int:
        """This identity's previous worker ID if it is free, else the lowest free one."""
        previous = own.worker_id if own is not None else -1
        for worker_id in sorted(range(MAX_WORKER_ID + 1), key=lambda w: (w != previous, w)):
            with contextlib.suppress(WorkerIdUnavailable):  # held: try the next one
                self._lock_worker(worker_id)
                return worker_id
        raise WorkerIdUnavailable(
            f"{self.identity}: all {MAX_WORKER_ID + 1} worker IDs are held by processes on "
            f"this host ({self.cache_dir})"
        )

    def _acquire(self, cached: CacheRecord | None) -> Start:
        worker_id = self.worker_id_for_identity(cached)
        if self._lock_fd is None:
            self._lock_worker(worker_id)
        recorded, where = 0, "no cache file yet"
        for path, record in read_all(self.cache_dir, self.identity):
            mine = record.identity == self.identity
            if (record.worker_id == worker_id or mine) and record.last_timestamp > recorded:
                recorded, where = record.last_timestamp, f"the cache file {path}"
        source = "local-host" if self.mapping is None else "local-map"
        return self._start(worker_id, recorded, where, cached, source)

    def _lock_worker(self, worker_id: int) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        path = self.cache_dir / f"worker-{worker_id:04d}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {worker_id} is held by another process on this "
                f"host (lock {path})"
            ) from exc
        self._lock_fd = fd

    def _write_mark(self, lease: Lease, ms: int) -> None:
        """The map is static: the mark lives in the cache file (written by the base)."""

    def _close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None
