"""The schema: ``leafpool db init`` creates it, everything else only checks it
(docs/design.md §1.2). A refill, the tag sync or a worker-ID claim runs as a database user
without CREATE, so nothing but :func:`create` runs DDL: Leaf's ``leaf_alloc`` (its DDL
file, unchanged), leafpool's own tables (from their SQLAlchemy tables), and on MySQL
NotFound9's ``leaf_workerid_alloc`` and the DC layout it serves (``leafpool_snowflake_layout``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

from sqlalchemy import Engine, Table, false, func, inspect, select, text
from sqlalchemy.exc import DBAPIError

from leafpool.core.errors import BackendUnavailable, ConfigurationError
from leafpool.core.setting_values import DATABASE_URL_ENV, hide_password
from leafpool.database.engine import OWN_TABLES, ddl_statement, driver_code, transaction
from leafpool.database.guard import tag_guard
from leafpool.database.layout_table import snowflake_layout

log = logging.getLogger(__name__)

MYSQL_NO_SUCH_TABLE = 1146
MYSQL_TABLE_DENIED = 1142


def create(engine: Engine) -> bool:
    """Create what is missing; True when ``leaf_alloc`` was created."""
    dialect = engine.dialect.name
    with transaction(engine, "create leafpool's tables") as conn:
        for table in (*OWN_TABLES, tag_guard):
            table.create(conn, checkfirst=True)
        if dialect == "mysql" and not inspect(conn).has_table("leaf_workerid_alloc"):
            conn.execute(text(ddl_statement("mysql", "leaf_workerid_alloc")))
        if dialect == "mysql":  # snowflake mode mysql's DC layout (docs/design.md §12.1)
            snowflake_layout.create(conn, checkfirst=True)
    with transaction(engine, "schema check") as conn:
        if inspect(conn).has_table("leaf_alloc"):
            return False
        conn.execute(text(ddl_statement(dialect, "leaf_alloc")))
    log.info("leaf_alloc created (%s)", dialect)
    return True


#: what a read of a table finds (:func:`probe`)
Found = Literal["readable", "absent", "not granted"]


def require(engine: Engine, tables: Iterable[Table], seen: set[str], what: str) -> set[str]:
    """The names of ``tables`` found there and readable (those in ``seen`` are not asked
    again); a table missing, or hidden from this user for want of a grant, raises
    :class:`ConfigurationError` naming ``leafpool db init`` and the grants. Not repaired
    here: without ``leafpool_retired_tag`` an allocation cannot know the marks of removed
    tags (G1)."""
    wanted = [t for t in tables if t.name not in seen]
    missing = []
    for table in wanted:
        found = probe(engine, table, what)
        if found != "readable":
            log.error("%s: %s not readable: %s", what, table.name, found)
            missing.append(table.name)
    if missing:
        raise ConfigurationError(
            DATABASE_URL_ENV, hide_password(engine.url.render_as_string(False)),
            f"a database where `leafpool db init` has run: {', '.join(missing)} is missing, "
            "or this database user may not read it (`leafpool db grants` prints what each "
            "role needs)")
    return {t.name for t in wanted}


def probe(engine: Engine, table: Table, what: str) -> Found:
    """Whether ``table`` is there and this user may read it, by a read of no rows (the
    inspector reports a table hidden by a missing grant as there): ``absent`` when it
    does not exist, ``not granted`` when it is hidden from this user (MySQL says so with
    another code); any other driver error is :class:`BackendUnavailable` naming ``what``."""
    try:
        with engine.connect() as conn:
            conn.execute(select(func.count()).select_from(table).where(false()))
    except DBAPIError as exc:
        if driver_code(exc) == MYSQL_NO_SUCH_TABLE or "no such table" in str(exc.orig):
            return "absent"
        if driver_code(exc) == MYSQL_TABLE_DENIED:
            return "not granted"
        raise BackendUnavailable(f"database: {what} failed: {exc.orig!r}") from exc
    return "readable"
