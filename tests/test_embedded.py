"""``leafpool up`` (the README's first command, after installing): the embedded default
comes up, serves IDs from both modes, and Ctrl-C stops everything it started."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from tests import services
from tests.proc import Proc, leafpool_env

pytestmark = pytest.mark.slow


def test_up_serves_ids_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        services.missing("redis-server")
    port, http_port = services.free_port(), services.free_port()
    env = leafpool_env(home=tmp_path / "home", redis_url=f"redis://127.0.0.1:{port}/0",
                       http_port=http_port)
    up = Proc([sys.executable, "-m", "leafpool.cli", "up"], env)
    try:
        pids = [int(up.wait_line(f"  started {name} (pid ", 60).split("pid ")[1].split(",")[0])
                for name in ("redis", "worker", "beat", "http")]
        line = up.wait_line("IDs served from the segment pool 'demo'", 120)
        assert line.endswith("[1, 2, 3, 4, 5]")
        up.wait_line("IDs served from the snowflake pool 'demo.flake'", 10)
        up.wait_line("Ctrl-C stops everything", 10)
        r = redis.Redis(port=port)
        assert int(r.lpop("leafpool:{demo}:ids")) == 6  # type: ignore[arg-type]
        services.wait_until(lambda: services.port_open(http_port), 30, "HTTP service")
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/segment/get/demo",
                                    timeout=10) as resp:
            assert int(resp.read()) > 6
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
        assert not services.port_open(port) and not services.port_open(http_port)
        for pid in pids:  # every child was waited for: none is left running
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        up.kill()
