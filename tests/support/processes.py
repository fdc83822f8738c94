"""Starting and killing real helper processes from tests (``tests.support.roles`` roles, Celery,
``leafpool up``).

No process started here outlives the test run: each child gets a parent-death SIGKILL
(:mod:`leafpool.children`, when started from the main thread), and :meth:`Proc.kill`
kills the child's process group and then every descendant it had, including those in
sessions of their own (``leafpool up``'s children), so a failed test leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from leafpool.children import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A child process whose stdout lines can be awaited with a bound."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path | None = None) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.log = log
        self.known: dict[int, int] = {}  # descendants seen: pid -> start time
        self.seen: list[str] = []  # every line wait_line read
        with contextlib.ExitStack() as files:
            stderr = (subprocess.STDOUT if log is None
                      else files.enter_context(open(log, "ab")))
            self.proc = subprocess.Popen(
                list(argv), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr,
                text=True, start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL),
            )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line starting {prefix!r} in {timeout}s; saw {seen[-20:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            seen.append(line)
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tree(self) -> list[int]:
        """The running descendants of this child, remembered for :meth:`kill`."""
        found = descendants(self.proc.pid) if self.proc.returncode is None else {}
        self.known.update(found)
        return list(found)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker and its children). SIGKILL
        also reaches every descendant, in whatever session: those running now and those
        seen by :meth:`tree` before (reparented once their parent died)."""
        if sig != signal.SIGKILL:
            if self.alive():
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=60)
            return
        if self.proc.returncode is None:  # not reaped yet: the pid is still this child's
            self.tree()
            stat = _stat(self.proc.pid)
            if stat is not None:
                self.known[self.proc.pid] = stat[2]
        for pid, started in self.known.items():
            stat = _stat(pid)
            if stat is None or stat[2] != started:
                continue  # gone, or the pid now names another process
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        self.proc.wait(timeout=60)
        with contextlib.suppress(OSError):  # members of its group left after it exited
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        self.kill()


# -- process trees (Linux /proc) ----------------------------------------------------------

def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped by its parent)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(pid: int) -> dict[int, int]:
    """Every running process below ``pid`` (children, grandchildren, ...), with its start
    time (which tells a pid reused later apart)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] not in ("Z", "X"):
                children.setdefault(stat[1], []).append((int(entry.name), stat[2]))
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child, started in children.get(todo.pop(), []):
            found[child] = started
            todo.append(child)
    return found


def role(name: str, *args: str, env: dict[str, str]) -> Proc:
    return Proc([sys.executable, "-m", "tests.support.roles", name, *args], env)


def leafpool_env(raw: dict[str, str] | None = None, **settings: object) -> dict[str, str]:
    """The environment of a child: ``LEAFPOOL_<NAME>`` for each setting, plus ``raw``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env["PYTHONPATH"] = str(ROOT)
    env["LEAFPOOL_HOME"] = os.environ.get("LEAFPOOL_HOME", str(ROOT / ".leafpool"))
    env.update({f"LEAFPOOL_{key.upper()}": str(value) for key, value in settings.items()})
    # a child's temporary files (multiprocessing's pymp-* of a Celery worker the test
    # kills) under its home, which the test's own temporary directory holds, not in /tmp
    tmp = Path(env["LEAFPOOL_HOME"]) / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env.update(raw or {})
    return env


def own_home(directory: Path, temp: bool = True) -> dict[str, str]:
    """This process's environment with HOME and the XDG directories in ``directory``, and
    TMPDIR too (``temp``): a tool that writes caches or crash reports there (chromium's
    ``~/.config/chromium/Crash Reports``, checkov's ``~/.cache/checkov`` and its lark cache
    in the temporary folder) leaves nothing in the user's home or /tmp once ``directory``
    is removed (a test's tmp_path is, when the test passes). Chromium keeps the system's
    TMPDIR (``temp=False``): its socket path there must stay short, and it removes it."""
    dirs = {"HOME": directory, "XDG_CONFIG_HOME": directory / ".config",
            "XDG_CACHE_HOME": directory / ".cache", "XDG_DATA_HOME": directory / ".local",
            "XDG_STATE_HOME": directory / ".state"}
    if temp:
        dirs["TMPDIR"] = directory / "tmp"
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {**os.environ, **{name: str(path) for name, path in dirs.items()}}


def read_ids(*files: Path) -> list[list[int]]:
    return [[int(x) for x in f.read_text().split()] if f.exists() else [] for f in files]
