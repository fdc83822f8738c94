"""Starting and killing real helper processes from tests (``tests.procs`` roles, Celery)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose stdout lines can be awaited with a bound."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path | None = None) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.log = log
        self.proc = subprocess.Popen(
            list(argv), env=env, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if log is None else open(log, "ab"),  # noqa: SIM115
            text=True, start_new_session=True,
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
            if line.startswith(prefix):
                return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker and its children)."""
        if self.alive():
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def role(name: str, *args: str, env: dict[str, str]) -> Proc:
    return Proc([sys.executable, "-m", "tests.procs", name, *args], env)


def leafpool_env(raw: dict[str, str] | None = None, **settings: object) -> dict[str, str]:
    """The environment of a child: ``LEAFPOOL_<NAME>`` for each setting, plus ``raw``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env["PYTHONPATH"] = str(ROOT)
    env["LEAFPOOL_HOME"] = os.environ.get("LEAFPOOL_HOME", str(ROOT / ".leafpool"))
    env.update({f"LEAFPOOL_{key.upper()}": str(value) for key, value in settings.items()})
    env.update(raw or {})
    return env


def read_ids(*files: Path) -> list[list[int]]:
    return [[int(x) for x in f.read_text().split()] if f.exists() else [] for f in files]
