"""A tag's guard (docs/design.md §7.3): the application's own column holding the IDs it
stored, read as ``SELECT MAX(column) FROM table`` when Redis holds no mark for the tag
(a new or wiped Redis) and before a heal, so that the next range starts above every ID
the application stored.

A guard is a table and a column (``TABLE.COLUMN`` or ``SCHEMA.TABLE.COLUMN``), never SQL
text: each name is checked against :data:`IDENTIFIER` and quoted by SQLAlchemy when the
query is built, so nothing can be injected, and the worker's database user needs only
SELECT on that one table. Kept in leafpool's own ``leafpool_tag_guard`` (:data:`tag_guard`,
its one definition: ``leafpool db init`` creates it from there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Select,
    String,
    Table,
    column,
    func,
    select,
    table,
)
from sqlalchemy.sql.elements import quoted_name

from leafpool.core.errors import InvalidArgument
from leafpool.database.engine import metadata

#: a MySQL identifier leafpool accepts in a guard: letters, digits, ``_`` and ``$``, not
#: starting with a digit, at most 64 characters (MySQL's limit)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,63}")
ALLOWED = ("TABLE.COLUMN or SCHEMA.TABLE.COLUMN, each name of letters, digits, _ and $ "
           "(not starting with a digit, at most 64 characters)")

# leafpool's own: a segment tag's guard, the application's column holding the IDs it
# stored (`leafpool tag add TAG --guard TABLE.COLUMN`, `leafpool tag guard`); names, never
# SQL text. Created by `leafpool db init` (leafpool.database.schema.create).
tag_guard = Table(
    "leafpool_tag_guard",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False),
    Column("guard_schema", String(64), nullable=True),
    Column("guard_table", String(64), nullable=False),
    Column("guard_column", String(64), nullable=False),
    Column("update_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)


@dataclass(frozen=True)
class Guard:
    """Where the application stores a tag's IDs."""

    table: str
    column: str
    schema: str | None = None

    def __str__(self) -> str:
        return ".".join(p for p in (self.schema, self.table, self.column) if p)

    @classmethod
    def parse(cls, text: str) -> Guard:
        """``TABLE.COLUMN`` or ``SCHEMA.TABLE.COLUMN``; anything else is refused."""
        parts = text.split(".") if isinstance(text, str) else []
        if len(parts) not in (2, 3) or not all(IDENTIFIER.fullmatch(p) for p in parts):
            raise InvalidArgument("guard", text, ALLOWED)
        if len(parts) == 3:
            return cls(parts[1], parts[2], parts[0])
        return cls(parts[0], parts[1])

    def query(self) -> Select[tuple[object]]:
        """``SELECT MAX(column) FROM [schema.]table``, every name quoted."""
        target = table(quoted_name(self.table, True), column(quoted_name(self.column, True)),
                       schema=quoted_name(self.schema, True) if self.schema else None)
        return select(func.max(target.c[self.column]))


def read_guard(conn: Connection, tag: str) -> Guard | None:
    row = conn.execute(
        select(tag_guard.c.guard_schema, tag_guard.c.guard_table, tag_guard.c.guard_column)
        .where(tag_guard.c.biz_tag == tag)).first()
    if row is None:
        return None
    return Guard(row.guard_table, row.guard_column, row.guard_schema or None)


def write_guard(conn: Connection, tag: str, guard: Guard | None) -> None:
    """Set (or, with None, clear) the tag's guard."""
    conn.execute(tag_guard.delete().where(tag_guard.c.biz_tag == tag))
    if guard is not None:
        conn.execute(tag_guard.insert().values(
            biz_tag=tag, guard_schema=guard.schema, guard_table=guard.table,
            guard_column=guard.column))


def stored_max(conn: Connection, guard: Guard) -> int | None:
    """The largest ID the application stored (None: none yet). Raises ``ValueError`` when
    the column does not hold integers (a text column included, even of digits: MAX
    compares text); driver errors go up as they are."""
    value = conn.execute(guard.query()).scalar()
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    # a text column is refused even when it holds digits: MAX compares text ("99" > "100")
    number = value if isinstance(value, Decimal) else None  # DECIMAL(20,0) and the like
    if number is None or not number.is_finite() or number != number.to_integral_value():
        raise ValueError(f"MAX({guard.column}) is {value!r}, not an integer")
    return int(number)
