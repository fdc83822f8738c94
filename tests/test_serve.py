"""``leafpool serve --host --port --workers``: uvicorn's options, overriding
LEAFPOOL_HTTP_HOST / LEAFPOOL_HTTP_PORT, in real processes; bad values are refused with
exit code 2 and a message naming the option and the value."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from leafpool.redis.pool import Pool
from tests.support import services
from tests.support.processes import Proc, leafpool_env

LEAFPOOL = [sys.executable, "-m", "leafpool.cli"]


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return int(resp.status), resp.read().decode()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_options_override_the_environment(
    workers: int, redis_url: str, sqlite_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    Pool(r, "leafpool").register("order", "segment", 0)
    r.rpush("leafpool:{order}:ids", *range(1, 101))
    port, env_port = services.free_port(), services.free_port()
    # the environment names another address and port: the options must win
    env = leafpool_env(home=tmp_path / "home", redis_url=redis_url, database_url=sqlite_url,
                       http_host="127.0.0.2", http_port=env_port)
    serve = Proc([*LEAFPOOL, "serve", "--host", "127.0.0.1", "--port", str(port),
                  "--workers", str(workers)], env)
    try:
        pids = {int(serve.wait_line("INFO:     Started server process [", 60)
                    .split("[")[1].rstrip("]")) for _ in range(workers)}
        assert len(pids) == workers  # uvicorn's worker processes, each serving the app
        if workers > 1:
            assert pids <= set(serve.tree())
        base = f"http://127.0.0.1:{port}"
        services.wait_until(lambda: get(f"{base}/health")[0] == 200, 30, "leafpool serve")
        assert get(f"{base}/health") == (200, "ready\n")
        ids = [int(get(f"{base}/api/segment/get/order")[1]) for _ in range(10)]
        assert ids == list(range(1, 11))  # whichever worker answered: the pool's order
        assert not services.port_open(env_port)
        with pytest.raises(OSError):  # not bound to LEAFPOOL_HTTP_HOST (127.0.0.2)
            get(f"http://127.0.0.2:{port}/health")
    finally:
        serve.stop()
    assert not services.port_open(port)


@pytest.mark.parametrize("args, option, value", [
    (["--port", "70000"], "--port", "70000"),
    (["--port", "http"], "--port", "'http'"),
    (["--port", "0"], "--port", "0"),
    (["--workers", "0"], "--workers", "0"),
    (["--workers", "two"], "--workers", "'two'"),
    (["--host", "no-such-host.invalid"], "--host", "'no-such-host.invalid'"),
])
def test_bad_values_are_refused_naming_the_option(
    args: list[str], option: str, value: str, tmp_path: Path
) -> None:
    env = leafpool_env(home=tmp_path / "home", redis_url="redis://127.0.0.1:1/0")
    done = subprocess.run([*LEAFPOOL, "serve", *args], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.replace("│", " ").split())  # rich wraps it in a box
    assert f"Invalid value for '{option}': {value} is" in message, message
