"""Schemathesis against a real ``leafpool serve`` (a real redis-server, the embedded
SQLite store): every operation of the served /openapi.json fuzzed, in the positive and
the negative mode, with a fixed seed and a bounded number of examples. Checks: no 5xx,
every answer's status, content type and body as described, and the token enforced
(``ignored_auth``: a request whose token is taken away, or replaced with a wrong one,
is refused 401). Once with tokens set (the full route) and once without (the lean path
of the bare single-ID request, leafpool/http/fast.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.http_helpers import LEAF_ID, fill
from tests.support.processes import Proc, leafpool_env

LEAFPOOL = [sys.executable, "-m", "leafpool.cli"]
#: schemathesis' command line (``st``), run by this interpreter
ST = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]
TOKEN = "fuzz-token-1234"
#: small enough that the fuzz cannot drain a pool (an empty pool is a 503), large enough
#: for the coverage phase's bounds and their neighbours
MAX_COUNT = 50
POOL_IDS = 100_000
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,response_headers_conformance,ignored_auth")
SEED = 20240611
MAX_EXAMPLES = 12
RUN_SECONDS = 120  # a bound for a hung run, far above the ~20 s one takes


def schemathesis(location: str, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``st run`` with a fixed seed, a bounded number of examples and no example database
    (nothing of an earlier run replayed); its files under ``workdir``."""
    argv = [*ST, "run", location, "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
            "--workers", "1", "--generation-database", "none",
            # hypothesis' health check of generation time: a loaded machine is not a finding
            "--suppress-health-check", "too_slow",
            "--phases", "examples,coverage,fuzzing", "--no-color", "--request-timeout", "10",
            "--report", "junit", "--report-dir", str(workdir / "report"), *extra]
    env = {**os.environ, "HOME": str(workdir)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_SECONDS,
                          cwd=workdir, env=env)


def described(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/openapi.json", timeout=10) as resp:
        document: dict[str, Any] = json.load(resp)
    return document


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "no-tokens"])
def test_schemathesis_finds_nothing(tokens: bool, redis_url: str, sqlite_url: str,
                                    r: redis.Redis, tmp_path: Path) -> None:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", 1000, description="fuzzed")  # a leaf_alloc row for /db
    store.engine.dispose()
    fill(r, "order", list(range(1, POOL_IDS + 1)))
    fill(r, "orderno", [LEAF_ID + i for i in range(POOL_IDS)], mode="snowflake")
    port = services.free_port()
    settings: dict[str, object] = {"http_max_count": MAX_COUNT, "empty_wait_seconds": 0}
    auth: list[str] = []
    if tokens:
        settings["http_tokens"] = f"{TOKEN}=*"
        # the token as a header on every request; the token parameters not generated
        # (a random ?token= is a 401, and it would win over the header)
        auth = ["-H", f"X-Leafpool-Token: {TOKEN}",
                "--generation-with-security-parameters", "false"]
    env = leafpool_env(home=tmp_path / "home", redis_url=redis_url, database_url=sqlite_url,
                       **settings)
    serve = Proc([*LEAFPOOL, "serve", "--host", "127.0.0.1", "--port", str(port)], env,
                 log=tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        services.wait_until(lambda: services.port_open(port), 60, "leafpool serve")
        document = described(base)
        run = schemathesis(f"{base}/openapi.json", tmp_path, "--checks", CHECKS, *auth)
        # the checks can fail: the same run against a description that says the JSON
        # IDs are numbers (they are strings) finds it
        document["components"]["schemas"]["Ids"]["properties"]["ids"]["items"] = {
            "type": "integer"}
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps(document))
        caught = schemathesis(str(wrong), tmp_path, "--url", base, "--checks", CHECKS,
                              "--include-path", "/api/segment/ids/{tag}",
                              "--include-method", "GET", *auth)
    finally:
        serve.stop()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-20000:]
    # every described operation but the description's own (schemathesis leaves it out)
    operations = sum(1 for path, item in document["paths"].items() for method in item
                     if method != "parameters" and path != "/openapi.json")
    assert f"Tested: {operations}" in out, out[-5000:]
    assert "passed" in out and "failed" not in out, out[-5000:]
    assert caught.returncode == 1, caught.stdout[-5000:]
    assert "Response violates schema" in caught.stdout, caught.stdout[-5000:]
