"""A summary of the database's tags, computed by the database: the tag sync reads one row,
not one per tag, and skips its reads of Redis while the summary is unchanged
(docs/design.md §4)."""

from __future__ import annotations

from sqlalchemy import Engine, func, inspect, select

from leafpool.database.engine import leaf_alloc, snowflake_tag, transaction


def tags_fingerprint(engine: Engine) -> tuple[str, ...]:
    """``leaf_alloc``'s row count, the sums of its steps and of its names' lengths, its
    first and last name (and on MySQL/MariaDB the sum of every row's ``CRC32(tag:step)``),
    then the same of ``leafpool_snowflake_tag``'s names: a tag added, removed or renamed or
    a step changed changes it. SQLite has no CRC32: a name replaced by another of the same
    length between the first and the last, with the same step, goes unseen there (the
    sync's hourly full pass finds it)."""
    tag, step = leaf_alloc.c.biz_tag, leaf_alloc.c.step
    name = snowflake_tag.c.biz_tag
    crc = engine.dialect.name in ("mysql", "mariadb")
    segment = [func.count(), func.sum(step), func.sum(func.length(tag)), func.min(tag),
               func.max(tag)]
    snowflake = [func.count(), func.sum(func.length(name)), func.min(name), func.max(name)]
    if crc:
        segment.append(func.sum(func.crc32(func.concat_ws(":", tag, step))))
        snowflake.append(func.sum(func.crc32(name)))
    with transaction(engine, "tags fingerprint") as conn:
        rows = list(conn.execute(select(*segment)).one())
        if inspect(conn).has_table(snowflake_tag.name):  # a Leaf database without it: none
            rows += conn.execute(select(*snowflake)).one()
    return tuple(str(value) for value in rows)
