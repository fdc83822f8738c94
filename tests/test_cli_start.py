"""What the ``leafpool`` command imports before it does anything: every call of it pays
for its imports, so what only some commands use (the database side, the snowflake
registries, the HTTP service, the client) is imported by those commands, and importing
the ``leafpool`` package imports none of it. Checked by the modules a fresh process holds,
not by a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import leafpool

#: what the CLI's start leaves to the commands that use it: SQLAlchemy (the segment
#: store, the layout admin, ``db grants``' URL parser), kazoo and the registries
#: (``snowflake layout``, ``probe snowflake``), the HTTP service (``serve``), the client
#: (``pop``), urllib.request (``probe http``)
NOT_AT_START = (
    "sqlalchemy", "kazoo", "pymysql", "leafpool.database.engine", "leafpool.segment",
    "leafpool.snowflake.registry", "leafpool.housekeeping", "leafpool.client",
    "leafpool.embedded", "leafpool.http", "uvicorn", "starlette", "urllib.request",
)

#: and what importing the CLI leaves out too: redis-py, imported by the Runtime's first use
#: of Redis (a command's settings check imports it: LEAFPOOL_REDIS_URL read by its parser)
NO_REDIS = ("redis", "leafpool.redis.connect", "leafpool.redis.pool")

#: runs the code of argv[2] (or, without it, the CLI with the arguments after "--") and
#: writes the modules the process holds at its exit to argv[1]
REPORTER = textwrap.dedent("""
    import atexit, json, sys

    def report(path=sys.argv[1]):
        with open(path, "w") as f:
            json.dump(sorted(sys.modules), f)

    atexit.register(report)
    if sys.argv[2] != "--":
        exec(sys.argv[2])
    else:
        sys.argv = ["leafpool", *sys.argv[3:]]
        from leafpool.cli import main
        main()
""")


def held(tmp_path: Path, *args: str, env: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``args`` (code, or ``--`` and a command's arguments) in a fresh interpreter: its
    result and the modules it held at its exit."""
    modules = tmp_path / "modules.json"
    modules.unlink(missing_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    full_env.update({"LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"], **(env or {})})
    done = subprocess.run([sys.executable, "-c", REPORTER, str(modules), *args],
                          env=full_env, capture_output=True, text=True, timeout=60)
    assert modules.exists(), done.stderr
    return done, set(json.loads(modules.read_text()))


def imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The ``names`` that ``modules`` holds, a package counted by any module of it."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_importing_the_cli_leaves_what_only_some_commands_use(tmp_path: Path) -> None:
    done, modules = held(tmp_path, "import leafpool.cli")
    assert done.returncode == 0, done.stderr
    assert "leafpool.cli" in modules  # the check sees what the process imported
    assert imported(modules, NOT_AT_START + NO_REDIS) == []


@pytest.mark.parametrize("args", [["--help"], ["status", "--json"], ["tag", "--help"]],
                         ids=" ".join)
def test_a_command_that_needs_neither_the_database_nor_the_registries_starts_without_them(
    tmp_path: Path, redis_url: str, sqlite_url: str, args: list[str]
) -> None:
    done, modules = held(tmp_path, "--", *args, env={
        "LEAFPOOL_REDIS_URL": redis_url, "LEAFPOOL_DATABASE_URL": sqlite_url})
    assert done.returncode == 0, done.stderr
    if args == ["status", "--json"]:
        assert done.stdout == "[]\n"  # an empty Redis: it ran, and read Redis
        assert "leafpool.redis.pool" in modules
    else:
        assert "Usage: leafpool" in done.stdout
    assert imported(modules, NOT_AT_START) == []


def test_importing_the_package_imports_neither_the_client_nor_its_dependencies(
    tmp_path: Path
) -> None:
    done, modules = held(tmp_path, "import leafpool")
    assert done.returncode == 0, done.stderr
    assert imported(modules, ("leafpool.client", "redis", "pydantic", "pydantic_settings",
                              "leafpool.core.config")) == []


def test_the_package_names_are_what_they_were() -> None:
    """``from leafpool import X`` for each of ``__all__``, ``Client`` and ``AsyncClient``
    the client's own classes, the package's modules still importable by the same
    statement, an unknown name an AttributeError naming it."""
    from leafpool import AsyncClient, Client, PoolEmpty, metrics
    from leafpool.client import AsyncClient as ClientsAsyncClient
    from leafpool.client import Client as ClientsClient
    from leafpool.core.errors import PoolEmpty as ErrorsPoolEmpty

    assert (Client, AsyncClient, PoolEmpty) == (ClientsClient, ClientsAsyncClient,
                                                 ErrorsPoolEmpty)
    assert metrics.__name__ == "leafpool.metrics"
    for name in leafpool.__all__:
        assert getattr(leafpool, name) is not None, name
    assert set(leafpool.__all__) <= set(dir(leafpool))
    with pytest.raises(AttributeError, match="'leafpool' has no attribute 'NoSuchName'"):
        leafpool.NoSuchName  # noqa: B018
    with pytest.raises(ImportError):
        from leafpool import NoSuchName  # noqa: F401
