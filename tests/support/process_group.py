"""What the Redis and the MariaDB topologies share (tests/support/topologies.py,
tests/support/mariadb_topologies.py): processes and their throwaway directories, stopped
and removed together (also a context manager); an ``atexit`` hook stops a group a caller
forgot; the end of every process's log, for a failure message."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

from tests.support.servers import Server


class Member(Protocol):
    server: Server

    def stop(self) -> None: ...


M = TypeVar("M", bound=Member)

_LIVE: set[ProcessGroup[Member]] = set()  # started and not stopped yet


@atexit.register
def _stop_all() -> None:
    for group in list(_LIVE):
        group.stop()


def log_tail(server: Server, chars: int = 2000) -> str:
    try:
        return server.log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class ProcessGroup(Generic[M]):
    """Processes (``members``) and directories stopped and removed together."""

    def __init__(self) -> None:
        self.members: list[M] = []
        self.dirs: list[Path] = []
        _LIVE.add(self)  # type: ignore[arg-type]

    def tmpdir(self, prefix: str) -> Path:
        """A new directory, removed by :meth:`stop`."""
        path = Path(tempfile.mkdtemp(prefix=f"leafpool-{prefix}-"))
        self.dirs.append(path)
        return path

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()
        _LIVE.discard(self)  # type: ignore[arg-type]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, chars: int = 1500) -> str:
        """The end of every process's log."""
        return "\n".join(f"--- {m.server.name} :{m.server.port}\n{log_tail(m.server, chars)}"
                         for m in self.members)
