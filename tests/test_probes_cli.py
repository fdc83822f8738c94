"""``leafpool probe`` and the image's HEALTHCHECK (issue 20, item 2): the Dockerfile's
HEALTHCHECK probes the port its CMD serves on (LEAFPOOL_HTTP_PORT's default, the port it
EXPOSEs), and the HEALTHCHECK's command, run as it is against a real ``leafpool serve``
on loopback, passes; with nothing listening, or the service on another port, it fails."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from leafpool.cli_probe import http_probe_url
from leafpool.core.config import Settings
from tests.support import services
from tests.support.processes import Proc, leafpool_env

ROOT = Path(__file__).resolve().parents[1]
LEAFPOOL = [sys.executable, "-m", "leafpool.cli"]


def _instruction(name: str) -> str:
    """One Dockerfile instruction's arguments (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.+)$", text, re.MULTILINE)
    assert len(found) == 1, (name, found)
    return str(found[0]).strip()


def healthcheck_command() -> list[str]:
    """The HEALTHCHECK's CMD (exec form), its options skipped."""
    args = _instruction("HEALTHCHECK")
    options, _, cmd = args.partition(" CMD ")
    assert all(o.startswith("--") for o in shlex.split(options)), options
    command: list[str] = json.loads(cmd)
    return command


def test_the_healthcheck_probes_the_port_the_cmd_serves_on() -> None:
    cmd: list[str] = json.loads(_instruction("CMD"))
    assert cmd == ["leafpool", "serve"]  # no --port: it serves on LEAFPOOL_HTTP_PORT
    assert "LEAFPOOL_HTTP_PORT" not in _instruction("ENV")  # so, on its default
    default_port = Settings.model_fields["http_port"].default
    assert str(default_port) in _instruction("EXPOSE").split()
    assert healthcheck_command() == ["leafpool", "probe", "http"]
    # the probe asks that very port (the image's address is loopback or a wildcard)
    assert http_probe_url("127.0.0.1", default_port) == f"http://127.0.0.1:{default_port}/healthz"
    assert http_probe_url("0.0.0.0", default_port) == f"http://127.0.0.1:{default_port}/healthz"
    assert http_probe_url("::", 8080, ready=True) == "http://127.0.0.1:8080/readyz"
    assert http_probe_url("::1", 8080) == "http://[::1]:8080/healthz"


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [*LEAFPOOL, *command[1:]] if command[0] == "leafpool" else command
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_healthcheck_passes_against_a_real_leafpool_serve(
    host: str, redis_url: str, sqlite_url: str, tmp_path: Path,
) -> None:
    port = services.free_port()
    env = leafpool_env(home=tmp_path / "home", redis_url=redis_url, database_url=sqlite_url,
                       http_host=host, http_port=port)
    command = healthcheck_command()
    before = _run(command, env)
    assert before.returncode == 1 and "/healthz" in before.stderr  # nothing listens yet
    serve = Proc([*LEAFPOOL, "serve"], env)  # the image's CMD, on LEAFPOOL_HTTP_PORT
    try:
        serve.wait_line("INFO:     Uvicorn running on", 60)
        done = _run(command, env)
        assert done.returncode == 0, done.stderr
        assert f"http://127.0.0.1:{port}/healthz: alive" in done.stdout
        ready = _run([*command, "--ready"], env)
        assert ready.returncode == 0 and "ready" in ready.stdout, ready.stderr
        # the same probe with another port configured (the CosId mistake) fails
        other = _run(command, {**env, "LEAFPOOL_HTTP_PORT": str(services.free_port())})
        assert other.returncode == 1
    finally:
        serve.stop()
    assert _run(command, env).returncode == 1


def test_probe_http_ready_fails_naming_redis_when_it_is_down(
    sqlite_url: str, tmp_path: Path,
) -> None:
    port = services.free_port()
    env = leafpool_env(home=tmp_path / "home", database_url=sqlite_url, http_port=port,
                       redis_url=f"redis://u:Secret9@127.0.0.1:{services.free_port()}/0")
    serve = Proc([*LEAFPOOL, "serve"], env)
    try:
        serve.wait_line("INFO:     Uvicorn running on", 60)
        assert _run(["leafpool", "probe", "http"], env).returncode == 0  # alive
        ready = _run(["leafpool", "probe", "http", "--ready"], env)
        assert ready.returncode == 1 and "503 not ready: redis:" in ready.stderr
        assert "Secret9" not in ready.stderr
    finally:
        serve.stop()
