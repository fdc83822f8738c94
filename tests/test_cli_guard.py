"""``leafpool tag add --guard`` and ``leafpool tag guard``, run as a real process on
both segment stores (docs/design.md §7.3)."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import text

from leafpool.segment.store import SegmentStore


def _cli(database_url: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_DATABASE_URL": database_url, "LEAFPOOL_REDIS_URL": redis_url,
                "COLUMNS": "200", "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})
    return subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_guard_is_set_shown_refused_and_cleared(database_url: str, redis_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(database_url, redis_url, *args)

    assert cli("db", "init").returncode == 0
    with SegmentStore.from_url(database_url).engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id BIGINT PRIMARY KEY)"))
        conn.execute(text("INSERT INTO orders VALUES (41), (977)"))
    added = cli("tag", "add", "order", "--step", "100", "--guard", "orders.id")
    assert added.returncode == 0 and "first ID 978" in added.stdout, added.stderr
    assert "order: guard orders.id (it reads 977)" in cli("tag", "guard", "order").stdout
    for args, needle in [
        (("orders.id; DROP TABLE leaf_alloc",), "guard='orders.id; DROP TABLE leaf_alloc' "
                                                "is not valid: TABLE.COLUMN or"),
        (("missing.id",), "guard='missing.id' is not valid: a table and column"),
        (("orders.id", "--clear"), "either TABLE.COLUMN or --clear"),
    ]:
        refused = cli("tag", "guard", "order", *args)
        assert refused.returncode == 2 and needle in refused.stderr, refused.stderr
    assert "guard orders.id (it reads 977)" in cli("tag", "guard", "order").stdout  # kept
    assert cli("tag", "guard", "nope").returncode == 2  # unknown tag
    assert "order: guard cleared" in cli("tag", "guard", "order", "--clear").stdout
    assert "order: no guard" in cli("tag", "guard", "order").stdout
    assert "guard orders.id set (it reads 977)" in \
        cli("tag", "guard", "order", "orders.id").stdout
    snowflake = cli("tag", "add", "flake", "--mode", "snowflake", "--guard", "orders.id")
    assert snowflake.returncode == 2 and "not used by snowflake tags" in snowflake.stderr
