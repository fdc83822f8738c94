"""Who sends each Redis command: every command that leafpool's own code sends must come
from a module of the Redis layer (``leafpool/redis/``, docs/design.md §0).

:func:`install` wraps redis-py's ``send_packed_command`` (blocking and asyncio), through
which every command and pipeline leaves a connection. For each send it walks the stack
past redis-py's own frames to the code that called redis-py: when that code is a module of
``leafpool/`` or ``workers/`` outside ``leafpool/redis/``, the send is recorded as a
violation. Celery's and kombu's commands (the broker), and the tests' own, are not ours to
check. ``tests/conftest.py`` installs it for the whole session and fails the test during
which a violation happened.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import redis.asyncio.connection as async_connection
import redis.connection as sync_connection

import leafpool
import leafpool.redis
import workers

REDIS_PY = str(Path(redis.__file__).resolve().parent) + "/"
LAYER = str(Path(leafpool.redis.__file__).resolve().parent) + "/"
PROJECT = tuple(str(Path(m.__file__).resolve().parent) + "/"  # type: ignore[arg-type]
                for m in (leafpool, workers))


@dataclass
class Recorder:
    violations: list[str] = field(default_factory=list)
    sends: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, frame: FrameType | None, command: object) -> None:
        self.sends += 1
        where = issuer(frame)
        if where is None:
            return
        filename, line = where
        if filename.startswith(PROJECT) and not filename.startswith(LAYER):
            with self._lock:
                self.violations.append(f"{filename}:{line}: {_name(command)}")

    def take(self) -> list[str]:
        with self._lock:
            out, self.violations = self.violations, []
        return out


def issuer(frame: FrameType | None) -> tuple[str, int] | None:
    """(file, line) of the first caller outside redis-py, or None."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(REDIS_PY):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def _name(command: object) -> str:
    """The first command's name, for the message (a packed command or a list of them)."""
    first: Any = command[0] if isinstance(command, list | tuple) and command else command
    if isinstance(first, bytes | bytearray | memoryview):
        text = bytes(first)[:80].decode(errors="replace")
        parts = text.split("\r\n")
        return parts[2] if len(parts) > 2 else text
    return str(first)[:80]


RECORDER = Recorder()
_installed = False


def install() -> Recorder:
    """Wrap redis-py's sends (once per process); returns the recorder."""
    global _installed
    if _installed:
        return RECORDER
    sync_send = sync_connection.AbstractConnection.send_packed_command
    async_send = async_connection.AbstractConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        RECORDER.check(sys._getframe(1), command)
        return sync_send(self, command, *args, **kwargs)

    async def send_packed_command_async(self: Any, command: Any, *args: Any,
                                        **kwargs: Any) -> Any:
        RECORDER.check(sys._getframe(1), command)
        return await async_send(self, command, *args, **kwargs)

    sync_connection.AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    async_connection.AbstractConnection.send_packed_command = (  # type: ignore[method-assign]
        send_packed_command_async)
    _installed = True
    return RECORDER
