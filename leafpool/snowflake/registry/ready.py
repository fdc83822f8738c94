"""Readiness files of snowflake generators (docs/design.md §8.6): a process that holds
its worker-ID lease keeps ``{snowflake_cache_dir}/ready-{name}/{safe identity}.json``
(the worker ID, mode, pid and ``until_ms``: the wall-clock ms until which the lease is
surely held, refreshed at every renew) and removes it the moment it is fenced, cannot
confirm its lease, or releases the ID. ``leafpool probe snowflake`` (an exec probe in
the worker's container) reads them: ready when some file is fresh and its process runs.

A process killed without a chance to remove its file leaves it behind; its ``until_ms``
passes and its pid is gone, so it is never read as ready.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from leafpool.core.config import Settings
from leafpool.core.setting_values import validate_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    identity: str
    worker_id: int
    mode: str
    pid: int
    until_ms: int  # the lease is surely held until then (wall clock)
    updated_ms: int


def ready_dir(settings: Settings) -> Path:
    """Beside the cache files' directory (a name has no ``-``: never a name's)."""
    return Path(settings.snowflake_cache_dir) / f"ready-{validate_name(settings.snowflake_name)}"


class ReadyFile:
    """One generator's readiness file (written atomically; never raises: a probe that
    cannot be told is a probe that fails, never a generator that stops)."""

    def __init__(self, directory: Path, safe_identity: str) -> None:
        self.path = directory / f"{safe_identity}.json"

    def publish(self, state: Readiness) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(asdict(state), fh, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: readiness file %s not written: %s", state.identity, self.path, exc)

    def withdraw(self, identity: str, why: str) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("%s: readiness file %s not removed: %s", identity, self.path, exc)
            return
        log.warning("%s: not ready any more: %s", identity, why)


def _running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def probe(directory: Path, now_ms: int) -> tuple[list[Readiness], list[str]]:
    """The generators ready now (a fresh file whose process runs), and why each other
    file found is not."""
    ready: list[Readiness] = []
    stale: list[str] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            state = Readiness(**{k: data[k] for k in Readiness.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            stale.append(f"{path.name}: unreadable ({exc})")
            continue
        if state.until_ms <= now_ms:
            stale.append(f"{state.identity}: worker {state.worker_id}: lease not confirmed "
                         f"since {now_ms - state.until_ms} ms")
        elif not _running(state.pid):
            stale.append(f"{state.identity}: worker {state.worker_id}: pid {state.pid} gone")
        else:
            ready.append(state)
    return ready, stale
