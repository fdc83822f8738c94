"""The segment store: Leaf's ``leaf_alloc`` table in MySQL/MariaDB (or SQLite, the
embedded default), reached through SQLAlchemy.

The one write on the hot path is Leaf's allocation: advance ``max_id`` by the step and
read it back in one transaction; the range handed out is ``[max_id - step, max_id)``
(design.md G3). The table is Leaf's DDL unchanged, so a database a Leaf server already
uses (rows inserted by hand included) works as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from leafpool.config import MAX_ID, MAX_STEP
from leafpool.errors import (
    BackendUnavailable,
    InvalidArgument,
    SegmentExhausted,
    TagExists,
    UnknownTag,
)
from leafpool.tags import validate_tag

log = logging.getLogger(__name__)

metadata = MetaData()
leaf_alloc = Table(
    "leaf_alloc",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False, server_default=""),
    Column("max_id", BigInteger, nullable=False, server_default="1"),
    Column("step", Integer, nullable=False),
    Column("description", String(256), nullable=True),
    Column("update_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)

# leafpool's own table (not Leaf's): the tags served in snowflake mode.
snowflake_tag = Table(
    "leafpool_snowflake_tag",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False),
    Column("description", String(256), nullable=True),
    Column("create_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)


@dataclass(frozen=True)
class Segment:
    """A range ``[start, end)`` taken from the database by one ``max_id`` advance."""

    tag: str
    start: int
    end: int
    step: int
    table_step: int
    took_ms: float

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TagRow:
    tag: str
    max_id: int
    step: int
    description: str | None


def validate_step(step: int, max_step: int = MAX_STEP) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0 or step > max_step:
        raise InvalidArgument("step", step, f"an integer from 1 to {max_step:,}")
    return step


def validate_start(start: int, step: int) -> int:
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InvalidArgument("start", start, "an integer >= 0 (the first ID handed out)")
    if start > MAX_ID - step:
        raise InvalidArgument(
            "start", start, f"at most 2**63 - 1 - step = {MAX_ID - step} so one segment fits"
        )
    return start


def make_engine(url: str) -> Engine:
    """An engine with short connect timeouts, so a database outage is noticed in seconds."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    connect_args: dict[str, object] = {}
    if parsed.get_backend_name() == "mysql":
        connect_args = {"connect_timeout": 5, "read_timeout": 15, "write_timeout": 15}
    return create_engine(url, pool_pre_ping=True, pool_recycle=1800, connect_args=connect_args)


@contextmanager
def transaction(
    engine: Engine, what: str, passthrough: Callable[[DBAPIError], bool] = lambda _: False
) -> Iterator[Connection]:
    """One transaction, the driver boundary of every database user: an
    :class:`IntegrityError` (and what ``passthrough`` accepts) goes up as it is, any
    other driver error becomes :class:`BackendUnavailable` naming ``what``."""
    try:
        with engine.begin() as conn:
            yield conn
    except IntegrityError:
        raise
    except DBAPIError as exc:
        if passthrough(exc):
            raise
        raise BackendUnavailable(f"database: {what} failed: {exc.orig!r}") from exc
    except SQLAlchemyError as exc:
        raise BackendUnavailable(f"database: {what} failed: {exc}") from exc


class SegmentStore:
    """Tags and segment allocation in ``leaf_alloc``."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._clock = clock

    @classmethod
    def from_url(cls, url: str) -> SegmentStore:
        try:
            return cls(make_engine(url))
        except SQLAlchemyError as exc:
            raise BackendUnavailable(f"database: cannot open {url!r}: {exc}") from exc

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _tx(self, what: str) -> AbstractContextManager[Connection]:
        return transaction(self.engine, what)

    # -- schema -------------------------------------------------------------------------

    def ddl(self) -> str:
        name = "leaf_alloc.mysql.sql" if self.dialect == "mysql" else "leaf_alloc.sqlite.sql"
        return (Path(__file__).parent / "sql" / name).read_text()

    def init_schema(self) -> bool:
        """Create ``leaf_alloc`` with Leaf's DDL unless it exists (True when created), and
        leafpool's own ``leafpool_snowflake_tag``."""
        with self._tx("schema check") as conn:
            snowflake_tag.create(conn, checkfirst=True)
            if inspect(conn).has_table("leaf_alloc"):
                return False
            conn.execute(text(self.ddl()))
        log.info("leaf_alloc created (%s)", self.dialect)
        return True

    # -- snowflake tags -----------------------------------------------------------------

    def add_snowflake_tag(self, tag: str, description: str | None = None) -> None:
        validate_tag(tag)
        if description is not None and len(description) > 256:
            raise InvalidArgument("description", description, "at most 256 characters")
        if self._exists(leaf_alloc, tag):
            raise TagExists(tag)
        try:
            with self._tx(f"{tag}: insert snowflake tag") as conn:
                conn.execute(snowflake_tag.insert().values(biz_tag=tag, description=description))
        except IntegrityError as exc:
            raise TagExists(tag) from exc

    def list_snowflake_tags(self) -> list[str]:
        with self._tx("list snowflake tags") as conn:
            if not inspect(conn).has_table("leafpool_snowflake_tag"):
                return []
            rows = conn.execute(select(snowflake_tag.c.biz_tag).order_by(snowflake_tag.c.biz_tag))
            return [r.biz_tag for r in rows]

    def remove_snowflake_tag(self, tag: str) -> bool:
        with self._tx(f"{tag}: delete snowflake tag") as conn:
            result = conn.execute(snowflake_tag.delete().where(snowflake_tag.c.biz_tag == tag))
            return bool(result.rowcount)

    def _exists(self, table: Table, tag: str) -> bool:
        with self._tx(f"{tag}: read") as conn:
            if not inspect(conn).has_table(table.name):
                return False
            return conn.execute(
                select(table.c.biz_tag).where(table.c.biz_tag == tag)
            ).first() is not None

    # -- tags ---------------------------------------------------------------------------

    def add_tag(
        self, tag: str, step: int, start: int = 1, description: str | None = None
    ) -> TagRow:
        """Register a tag whose first ID will be ``start``."""
        validate_tag(tag)
        validate_step(step)
        validate_start(start, step)
        if description is not None and len(description) > 256:
            raise InvalidArgument("description", description, "at most 256 characters")
        if self._exists(snowflake_tag, tag):  # one name, one tag across modes
            raise TagExists(tag)
        try:
            with self._tx(f"{tag}: insert") as conn:
                conn.execute(
                    leaf_alloc.insert().values(
                        biz_tag=tag, max_id=start, step=step, description=description
                    )
                )
        except IntegrityError as exc:
            raise TagExists(tag) from exc
        return TagRow(tag, start, step, description)

    def get_tag(self, tag: str) -> TagRow:
        with self._tx(f"{tag}: read") as conn:
            row = conn.execute(
                select(leaf_alloc.c.max_id, leaf_alloc.c.step, leaf_alloc.c.description).where(
                    leaf_alloc.c.biz_tag == tag
                )
            ).first()
        if row is None:
            raise UnknownTag(tag)
        return TagRow(tag, int(row.max_id), int(row.step), row.description)

    def list_tags(self) -> list[TagRow]:
        with self._tx("list tags") as conn:
            rows = conn.execute(
                select(
                    leaf_alloc.c.biz_tag,
                    leaf_alloc.c.max_id,
                    leaf_alloc.c.step,
                    leaf_alloc.c.description,
                ).order_by(leaf_alloc.c.biz_tag)
            ).all()
        return [TagRow(r.biz_tag, int(r.max_id), int(r.step), r.description) for r in rows]

    def set_step(self, tag: str, step: int) -> None:
        validate_step(step)
        with self._tx(f"{tag}: set step") as conn:
            result = conn.execute(
                leaf_alloc.update().where(leaf_alloc.c.biz_tag == tag).values(step=step)
            )
            if result.rowcount == 0:
                raise UnknownTag(tag)

    def remove_tag(self, tag: str) -> None:
        with self._tx(f"{tag}: delete") as conn:
            result = conn.execute(leaf_alloc.delete().where(leaf_alloc.c.biz_tag == tag))
            if result.rowcount == 0:
                raise UnknownTag(tag)

    # -- allocation ---------------------------------------------------------------------

    def allocate(
        self, tag: str, choose_step: Callable[[int], int] | None = None
    ) -> Segment:
        """Advance ``max_id`` by one step and return the range ``[max_id - step, max_id)``.

        ``choose_step(table_step)`` picks the step (dynamic step); by default the table's.
        An advance that would pass 2**63 - 1 raises :class:`SegmentExhausted` and writes
        nothing.
        """
        started = self._clock()
        with self._tx(f"{tag}: allocate") as conn:
            row = conn.execute(
                select(leaf_alloc.c.max_id, leaf_alloc.c.step).where(leaf_alloc.c.biz_tag == tag)
            ).first()
            if row is None:
                raise UnknownTag(tag)
            if int(row.max_id) < 0:
                raise InvalidArgument(
                    f"{tag}: max_id", int(row.max_id), "non-negative (IDs are >= 0)"
                )
            table_step = int(row.step)
            step = choose_step(table_step) if choose_step else table_step
            if step <= 0:
                raise InvalidArgument(f"{tag}: step", step, "a positive integer")
            result = conn.execute(
                leaf_alloc.update()
                .where(leaf_alloc.c.biz_tag == tag, leaf_alloc.c.max_id <= MAX_ID - step)
                .values(max_id=leaf_alloc.c.max_id + step, update_time=func.current_timestamp())
            )
            if result.rowcount == 0:
                raise SegmentExhausted(tag, int(row.max_id), step)
            max_id = conn.execute(
                select(leaf_alloc.c.max_id).where(leaf_alloc.c.biz_tag == tag)
            ).scalar_one()
        max_id = int(max_id)
        took = (self._clock() - started) * 1000
        log.debug("%s: allocated [%d, %d) step=%d in %.1f ms", tag, max_id - step, max_id,
                  step, took)
        return Segment(tag, max_id - step, max_id, step, table_step, took)
