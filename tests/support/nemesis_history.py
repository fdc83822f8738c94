"""The files of a nemesis run (tests/support/nemesis.py) and how they are written and read.

A run directory holds:

- ``history/<client>.jsonl``: one line per call a client process made, written by that
  process (tests/support/nemesis_client.py): ``s`` and ``e`` (wall-clock start and end,
  seconds since 1970), ``tag``, ``op`` (``id``: ``next_id``; ``ids``: ``next_ids(n)``;
  ``http``: ``GET /api/<mode>/ids/<tag>?count=n``), ``n``, ``ids`` (what the caller got:
  the IDs handed out, a ``PoolEmpty``'s partial IDs included), ``err`` (the error's
  class; absent when the call succeeded) and ``msg`` (its message, cut short);
- ``events.jsonl``: the nemesis's own log (``t`` and ``ev``: ``phase``, ``fault-start``,
  ``fault-end``, ``skip``, ``exited``, ``restart``, ``restart-failed``, ``sentinel``);
- ``meta.json``: what was run (seed, tags and their modes, settings, clients);
- ``accounting.json``: per tag, what Redis counted once the clients had stopped
  (``pushed_total``, ``gaps``, ``ready``, ``unacked_ids``, ``lost_replies``).

The wall clock is the one clock every process of the run shares with the Redis and
Celery logs; the run itself never sets it. Like the rest of tests/support, no pytest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HISTORY = "history"
EVENTS = "events.jsonl"
META = "meta.json"
ACCOUNTING = "accounting.json"


@dataclass(frozen=True)
class Call:
    """One call of a client: what it asked, when, and what it got."""

    client: str
    start: float
    end: float
    tag: str
    op: str
    n: int
    ids: tuple[int, ...] = ()
    err: str | None = None
    msg: str | None = None  # the error's message, cut short

    @property
    def ok(self) -> bool:
        return self.err is None

    @property
    def served(self) -> bool:
        """The caller got at least one ID (a ``PoolEmpty`` with partial IDs included)."""
        return bool(self.ids)


@dataclass(frozen=True)
class Event:
    """One line of the nemesis's event log."""

    t: float
    ev: str
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


class LineWriter:
    """JSON lines to a file, flushed every ``flush_s`` seconds and at :meth:`close`;
    thread-safe (the event log is written by the main loop and the Sentinel listener)."""

    def __init__(self, path: Path, flush_s: float = 0.2) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close)
        self._lock = threading.Lock()
        self._flush_s = flush_s
        self._flushed = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._fh.write(line)
            if time.monotonic() - self._flushed >= self._flush_s:
                self._fh.flush()
                self._flushed = time.monotonic()

    def flush(self) -> None:
        with self._lock:
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


class EventLog(LineWriter):
    """The nemesis's events, flushed at once (they are few and read after a crash too)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, flush_s=0.0)

    def log(self, ev: str, t: float | None = None, **data: Any) -> None:
        self.write({"t": time.time() if t is None else t, "ev": ev, **data})


def call_record(start: float, end: float, tag: str, op: str, n: int, ids: list[int],
                err: str | None, msg: str | None = None) -> dict[str, Any]:
    """One line of a client's history; ``msg``: the error's message (cut to 200
    characters), for whoever reads the history to find a pause's cause."""
    record: dict[str, Any] = {"s": round(start, 6), "e": round(end, 6), "tag": tag,
                              "op": op, "n": n, "ids": ids}
    if err is not None:
        record["err"] = err
        if msg:
            record["msg"] = msg[:200]
    return record


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete JSON line of ``path`` (a last line cut short by a kill is skipped)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            yield json.loads(line)


def read_calls(run_dir: Path) -> list[Call]:
    calls: list[Call] = []
    for path in sorted((run_dir / HISTORY).glob("*.jsonl")):
        client = path.stem
        calls += [Call(client, r["s"], r["e"], r["tag"], r["op"], r["n"],
                       tuple(r.get("ids", ())), r.get("err"), r.get("msg"))
                  for r in _lines(path)]
    return calls


def read_events(run_dir: Path) -> list[Event]:
    path = run_dir / EVENTS
    if not path.exists():
        return []
    out = []
    for r in _lines(path):
        t, ev = r.pop("t"), r.pop("ev")
        out.append(Event(t, ev, r))
    return sorted(out, key=lambda e: e.t)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return data
