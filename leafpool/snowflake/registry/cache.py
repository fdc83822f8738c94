"""The local cache file of a generator identity (Leaf's ``workerID.properties``, plus the
last timestamp): ``{snowflake_cache_dir}/{snowflake_name}/{safe identity}.json``, written
atomically and durably (docs/design.md §8.1)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from leafpool.core.errors import WorkerIdUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheRecord:
    worker_id: int
    last_timestamp: int  # ms: the high-water mark recorded for the worker ID
    identity: str
    mode: str
    token: str = ""  # the claim token of the process that wrote it
    lease_until: int = 0  # ms: leased modes, until when the lease is surely ours (0: none)
    updated_at: int = 0  # ms, the writer's clock
    pid: int = 0  # the writing process
    #: ms: the mark the source surely held when this was written (leasing modes: recorded
    #: ahead of the clock, docs/design.md §8.1); a start from this file may use the
    #: timestamps up to it while its cached lease runs. 0: unknown (an older file)
    source_mark: int = 0

    def writer_gone(self) -> bool:
        """True when the process that wrote this record is not running any more (on
        this host: the cache directory is local): its lease may be taken over."""
        if self.pid <= 0:
            return True
        try:
            os.kill(self.pid, 0)  # signal 0 only asks whether it runs (we do)
        except ProcessLookupError:
            return True
        except PermissionError:  # it runs, as another user
            return False
        return False

    def left_by_gone_writer(self, token: object, pid: object = None) -> bool:
        """True when a holding marked with ``token`` (and ``pid``, when it says) is this
        identity's previous process, the one that wrote this record, now gone: it may be
        taken over. Any other holder may be another live process."""
        if not self.token or token != self.token:
            return False
        return (replace(self, pid=pid) if isinstance(pid, int) else self).writer_gone()


class CacheFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> CacheRecord | None:
        """The record, or None when there is no file. A file that cannot be parsed
        refuses the start: it may have held the only record of the last timestamp."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkerIdUnavailable(f"cache file {self.path}: cannot read: {exc}") from exc
        try:
            data = json.loads(text)
            record = CacheRecord(int(data["worker_id"]), int(data["last_timestamp"]), "", "")
            # the other fields the file has, each read as the type of its default
            fields = {k: type(v)(data[k]) for k, v in asdict(record).items() if k in data}
            return replace(record, **fields)
        except (ValueError, KeyError, TypeError) as exc:
            raise WorkerIdUnavailable(
                f"cache file {self.path} is corrupt ({exc}); check the clock against the "
                "worker ID's last timestamp, then delete the file"
            ) from exc

    def write(self, record: CacheRecord) -> None:
        """Replace the file atomically and durably."""
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(asdict(record), fh, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise WorkerIdUnavailable(
                f"{record.identity}: cannot write cache file {self.path}: {exc}"
            ) from exc


def read_all(directory: Path, identity: str) -> list[tuple[Path, CacheRecord]]:
    """Every readable cache record in ``directory`` (corrupt files are logged by
    ``identity``, the reader, and skipped)."""
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = CacheFile(path).read()
        except WorkerIdUnavailable as exc:
            log.warning("%s: skipped: %s", identity, exc)
            continue
        if record is not None:
            records.append((path, record))
    return records
