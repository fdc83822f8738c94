"""What only MySQL/MariaDB shows: Leaf's DDL unchanged."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from leafpool.core.errors import TagExists
from leafpool.database.engine import ddl_statement
from leafpool.segment.store import SegmentStore
from tests.support import services

ROOT = Path(__file__).resolve().parents[2]


def test_schema_is_leafs_ddl_and_shipped_under_ops(mysql_url: str) -> None:
    store = SegmentStore.from_url(mysql_url)
    assert store.init_schema() is True
    shipped = (ROOT / "leafpool" / "database" / "sql" / "mysql" / "leaf_alloc.sql").read_text()
    assert ddl_statement("mysql", "leaf_alloc") == shipped.strip().rstrip(";")
    with store.engine.connect() as conn:
        cols = {row[0]: row[1] for row in conn.execute(text("SHOW COLUMNS FROM leaf_alloc"))}
        ddl = conn.execute(text("SHOW CREATE TABLE leaf_alloc")).one()[1]
    assert cols == {"biz_tag": "varchar(128)", "max_id": "bigint(20)", "step": "int(11)",
                    "description": "varchar(256)", "update_time": "timestamp"}
    assert "ON UPDATE current_timestamp()" in ddl
    assert "PRIMARY KEY (`biz_tag`)" in ddl


def _lock_waits(store: SegmentStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS")).scalar_one())


@pytest.mark.parametrize("first_mode", ["snowflake", "segment"])
def test_one_name_cannot_be_added_in_both_modes_at_once(mysql_url: str, first_mode: str) -> None:
    """The other add is caught between its insert and its commit: this add must wait for
    it and then refuse, not succeed beside it."""
    store = SegmentStore.from_url(mysql_url)
    store.init_schema()
    other = store.engine.connect()
    tx = other.begin()
    if first_mode == "snowflake":
        other.execute(text("INSERT INTO leafpool_snowflake_tag(biz_tag) VALUES ('pay')"))
        add: Callable[[], object] = lambda: store.add_tag("pay", step=10)  # noqa: E731
    else:
        other.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 10)"))
        add = lambda: store.add_snowflake_tag("pay")  # noqa: E731
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            add()
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    # the add either finished (unsafe: it did not see the other insert) or waits on its
    # lock. InnoDB refreshes INNODB_LOCK_WAITS at most every 100 ms and only when it was
    # not read in the last 100 ms: polled faster, it would never show the wait.
    services.wait_until(lambda: bool(outcome) or _lock_waits(store) > 0, 30,
                        "the add finished or waits for the other add's row lock",
                        interval=0.25)
    tx.commit()
    other.close()
    thread.join(30)
    assert outcome and isinstance(outcome[0], TagExists), outcome
    with store.engine.connect() as conn:
        in_alloc = conn.execute(text("SELECT COUNT(*) FROM leaf_alloc")).scalar_one()
        in_flake = conn.execute(text("SELECT COUNT(*) FROM leafpool_snowflake_tag")).scalar_one()
    assert (in_alloc, in_flake) == (1, 0) if first_mode == "segment" else (0, 1)
