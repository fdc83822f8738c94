"""The house (docs/design.md §0): leafpool/ in rooms, each importing only from the rooms
below it, no import circle even counting type-only imports, every Redis command from the
Redis layer, small modules."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest
import redis

from tests.support import redis_layer

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "leafpool"
ROOMS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "workers").rglob("*.py")])


def import_cycles(*packages: str) -> list[list[str]]:
    """Every import circle among the modules of ``packages`` (strongly connected
    components of the import graph with more than one module, or a module importing
    itself). grimp reads every import statement, those under ``if TYPE_CHECKING:`` and
    inside functions included."""
    graph = grimp.build_graph(*packages, include_external_packages=False, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1 or module in edges[module]:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_circle_in_leafpool_and_workers_type_only_imports_counted() -> None:
    assert import_cycles("leafpool", "workers") == []


def test_the_circle_check_sees_a_circle_made_only_of_type_only_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape the flat layout had (settings -> pool -> settings, the return edge only
    under TYPE_CHECKING): found."""
    pkg = tmp_path / "circled"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from circled.pool import Pool
    """))
    (pkg / "pool.py").write_text("from circled.settings import TYPE_CHECKING\n")
    (pkg / "tags.py").write_text("import circled.settings\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("circled") == [["circled.pool", "circled.settings"]]


def test_the_import_contracts_in_pyproject_are_kept() -> None:
    """import-linter: the rooms' layers, no circle between siblings at any depth, no
    Celery in the library, redis-py only in the Redis layer, SQLAlchemy only at the
    database boundary, the store and the mysql registry."""
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)


def test_the_top_level_holds_at_most_15_modules_besides_the_rooms() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 15, modules
    assert {"core", "redis", "database", "refill", "segment", "snowflake", "housekeeping",
            "http"} <= set(ROOMS)


@functools.cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("leafpool", include_external_packages=False, cache_dir=None)


def _docstring(room: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text())) or ""


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_says_what_it_owns_and_imports_only_what_it_says(room: str) -> None:
    """A room's docstring has ``Owns:`` and ``May import:``; the rooms its modules
    import (type-only imports included) are among those it names."""
    doc = _docstring(room)
    assert "Owns:" in doc and "May import:" in doc, doc
    allowed_text = doc.split("May import:", 1)[1].split("\n\n", 1)[0]
    allowed = set(re.findall(r"leafpool\.(\w+)", allowed_text)) | {room}
    graph = _graph()
    used = set()
    for module in graph.find_descendants(f"leafpool.{room}") | {f"leafpool.{room}"}:
        for imported in graph.find_modules_directly_imported_by(module):
            parts = imported.split(".")
            used.add(parts[1] if len(parts) > 1 else "leafpool")
    assert used - allowed == set(), f"{room} imports {sorted(used - allowed)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 400


def test_a_redis_command_sent_from_outside_the_redis_layer_is_caught(redis_url: str) -> None:
    """The session-wide check (tests/support/redis_layer.py) against a command sent from a
    module of leafpool/housekeeping: recorded with its file and command; the same command
    from a module of the Redis layer is not."""
    recorder = redis_layer.install()
    client = redis.Redis.from_url(redis_url)
    source = "def send(client):\n    return client.llen('leafpool:{t}:ids')\n"
    outside: dict[str, object] = {}
    exec(compile(source, str(PACKAGE / "housekeeping" / "stray.py"), "exec"), outside)
    inside: dict[str, object] = {}
    exec(compile(source, str(PACKAGE / "redis" / "stray.py"), "exec"), inside)
    try:
        inside["send"](client)  # type: ignore[operator]
        assert recorder.take() == []
        outside["send"](client)  # type: ignore[operator]
        caught = recorder.take()
    finally:
        client.close()
    assert len(caught) == 1 and "housekeeping/stray.py:2: LLEN" in caught[0], caught
