"""Mode ``local``: NotFound9's static identity -> worker ID map
(``LEAFPOOL_SNOWFLAKE_LOCAL_MAP``, parsed with the settings: ``identity=worker_id,...``
or one worker ID for every process), or with an empty map the lowest worker ID free on
this host (one host only). A worker ID held is locked on the host; the mark lives in the
cache files (docs/design.md §8.5). With more than one DC the map's worker IDs must lie in
the DC's range and the lowest free one is taken from it; the cache directory records the
layout it serves in ``layout.record`` (docs/design.md §12.1).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from typing import Any

from leafpool.core.config import LOCAL_MAP_ENV, Settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable
from leafpool.snowflake.registry import layout
from leafpool.snowflake.registry.base import BaseRegistry, Lease, Start
from leafpool.snowflake.registry.cache import CacheRecord, read_all

log = logging.getLogger(__name__)

#: the cache directory's DC layout record (not ``*.json``: no cache file)
LAYOUT_FILE = "layout.record"


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
            return self._in_range(self.mapping)
        try:
            return self._in_range(self.mapping[self.identity])
        except KeyError:
            raise ConfigurationError(
                LOCAL_MAP_ENV,
                self.settings.snowflake_local_map,
                f"has no entry for this process's identity {self.identity!r}",
            ) from None

    def _in_range(self, worker_id: int) -> int:
        if worker_id not in self.dc:
            raise ConfigurationError(
                LOCAL_MAP_ENV, self.settings.snowflake_local_map,
                f"maps this process's identity {self.identity!r} to worker {worker_id}, "
                f"outside {self.dc.describe()} (LEAFPOOL_DC_ID={self.dc.dc_id}, "
                f"LEAFPOOL_DC_COUNT={self.dc.dc_count}): each DC's map lists worker IDs of "
                "its own range")
        return worker_id

    def _lowest_free(self, own: CacheRecord | None) -> int:
        """This identity's previous worker ID if it is free, else the lowest free one."""
        previous = own.worker_id if own is not None else -1
        for worker_id in sorted(self.dc.ids(), key=lambda w: (w != previous, w)):
            with contextlib.suppress(WorkerIdUnavailable):  # held: try the next one
                self._lock_worker(worker_id)
                return worker_id
        raise layout.exhausted(self.identity, self.dc,
                               f"held by processes on this host ({self.cache_dir})")

    def _check_layout(self) -> None:
        """Compare the cache directory's layout record with this process's DC settings
        (raise on a mismatch); write it when there is none. A directory with cache files
        from before the record served DC 0 of 1."""
        path = self.cache_dir / LAYOUT_FILE
        where = f"the layout record {path}"
        try:
            raw = path.read_text()
        except FileNotFoundError:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            files = [p for p in self.cache_dir.glob("*.json") if p.is_file()]
            history = f"{len(files)} cache files in {self.cache_dir}" if files else None
            layout.check(self.dc, None, where, history)
            tmp = path.with_name(f".{LAYOUT_FILE}.{os.getpid()}")
            tmp.write_text(json.dumps(layout.record_data(self.dc)) + "\n")
            try:
                os.link(tmp, path)  # the first writer's record stands; no overwrite
            except FileExistsError:
                self._check_layout_text(path.read_text(), where)
            else:
                log.info("%s: recorded in %s: this directory serves %s", self.identity,
                         path, self.dc.describe())
            finally:
                tmp.unlink()
            return
        self._check_layout_text(raw, where)

    def _check_layout_text(self, raw: str, where: str) -> None:
        try:
            data: Any = json.loads(raw)
        except ValueError:
            data = raw
        layout.check(self.dc, layout.parse_record(data, where), where, None)

    def _acquire(self, cached: CacheRecord | None) -> Start:
        self._check_layout()
        worker_id = self.worker_id_for_identity(cached)
        if self._lock_fd is None:
            self._lock_worker(worker_id)
        self._check_layout()  # again, the worker ID locked: `snowflake layout --set`
        # writes the record before it tries the locks, so one of the two sees the other
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
