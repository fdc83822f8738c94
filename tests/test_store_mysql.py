"""What only MySQL/MariaDB shows: Leaf's DDL unchanged."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from leafpool.store import SegmentStore

ROOT = Path(__file__).resolve().parent.parent


def test_schema_is_leafs_ddl_and_shipped_under_ops(mysql_url: str) -> None:
    store = SegmentStore.from_url(mysql_url)
    assert store.init_schema() is True
    shipped = (ROOT / "ops" / "sql" / "leaf_alloc.sql").read_text()
    assert store.ddl() == shipped
    with store.engine.connect() as conn:
        cols = {row[0]: row[1] for row in conn.execute(text("SHOW COLUMNS FROM leaf_alloc"))}
        ddl = conn.execute(text("SHOW CREATE TABLE leaf_alloc")).one()[1]
    assert cols == {"biz_tag": "varchar(128)", "max_id": "bigint(20)", "step": "int(11)",
                    "description": "varchar(256)", "update_time": "timestamp"}
    assert "ON UPDATE current_timestamp()" in ddl
    assert "PRIMARY KEY (`biz_tag`)" in ddl
