"""The HTTP package's shape (leafpool/http/): the entry points the CLI, uvicorn's
``--factory`` and docker-compose use are importable from ``leafpool.http``; every Redis
command goes through the access layer (AsyncPool, Pool) and every SQL statement through
the segment store; no module over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from uvicorn.importer import import_from_string

import leafpool.http
from leafpool.http import app_from_env, create_app, serve

PACKAGE = Path(leafpool.http.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))


def test_the_entry_points_are_importable_from_the_package() -> None:
    assert import_from_string("leafpool.http:app_from_env") is app_from_env
    assert callable(create_app) and callable(serve)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_redis_command_or_sql_outside_their_layers(path: Path) -> None:
    """No redis-py, no connection module, no SQLAlchemy, and no reaching into a client's
    or a pool's internals (``.redis``, ``.keys``): the pool and the store do that."""
    tree = ast.parse(path.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)]
    banned = ("redis", "leafpool.redis.connect", "sqlalchemy", "leafpool.database.engine",
              "leafpool.core.keys")
    assert [m for m in imported if m.split(".")[0] in banned or m in banned] == []
    internals = [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and node.attr in ("redis", "keys", "engine")]
    assert internals == []
