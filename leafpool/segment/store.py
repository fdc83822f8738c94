"""The segment store: Leaf's ``leaf_alloc`` table in MySQL/MariaDB (or SQLite, the
embedded default), reached through SQLAlchemy.

The one write on the hot path is Leaf's allocation: advance ``max_id`` by the step and
read it back in one transaction; the range handed out is ``[max_id - step, max_id)``
(docs/design.md §2, G3). The table is Leaf's DDL unchanged, so a database a Leaf server already
uses (rows inserted by hand included) works as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, Table, func, inspect, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from leafpool.core.config import MAX_ID, MAX_STEP
from leafpool.core.errors import (
    BackendUnavailable,
    CounterBehind,
    InvalidArgument,
    SegmentExhausted,
    TagExists,
    UnknownTag,
)
from leafpool.core.setting_values import hide_password
from leafpool.core.tags import validate_tag
from leafpool.database import schema
from leafpool.database.engine import (
    OWN_TABLES,
    is_deadlock,
    leaf_alloc,
    make_engine,
    retired_tag,
    snowflake_tag,
    transaction,
)
from leafpool.segment.step import StepRule

log = logging.getLogger(__name__)



FIRST_ID = 1  # IDs start at 1: a Leaf client reads 0 (and below) as a failure result


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
    if isinstance(start, bool) or not isinstance(start, int) or start < FIRST_ID:
        raise InvalidArgument(
            "start", start,
            f"an integer >= {FIRST_ID} (the first ID handed out; Leaf clients read 0 as a "
            "failure)")
    if start > MAX_ID - step:
        raise InvalidArgument(
            "start", start, f"at most 2**63 - 1 - step = {MAX_ID - step} so one segment fits"
        )
    return start


class SegmentStore:
    """Tags and segment allocation in ``leaf_alloc``."""

    def __init__(self, engine: Engine,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._monotonic = monotonic
        self._seen: set[str] = set()  # own tables found there (``_ensure_own_tables``)

    @classmethod
    def from_url(cls, url: str) -> SegmentStore:
        try:
            return cls(make_engine(url))
        except SQLAlchemyError as exc:
            raise BackendUnavailable(
                f"database: cannot open {hide_password(url)!r}: {type(exc).__name__}") from exc

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _tx(self, what: str) -> AbstractContextManager[Connection]:
        return transaction(self.engine, what)

    # -- schema -------------------------------------------------------------------------

    def init_schema(self) -> bool:
        """Create ``leaf_alloc`` with Leaf's DDL unless it exists (True when created), and
        leafpool's own ``leafpool_snowflake_tag`` and ``leafpool_retired_tag``."""
        created = schema.create(self.engine)  # the one DDL path (`leafpool db init`)
        self._seen = {table.name for table in OWN_TABLES}
        return created

    # -- snowflake tags -----------------------------------------------------------------

    def add_snowflake_tag(self, tag: str, description: str | None = None) -> None:
        validate_tag(tag)
        if description is not None and len(description) > 256:
            raise InvalidArgument("description", description, "at most 256 characters")

        def insert(conn: Connection) -> None:
            conn.execute(snowflake_tag.insert().values(biz_tag=tag, description=description))
            self._refuse_if_in(conn, leaf_alloc, tag)

        self._ensure_own_tables()
        self._add(tag, "insert snowflake tag", insert)

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

    # -- one name, one tag across modes -------------------------------------------------

    def _add(self, tag: str, what: str, body: Callable[[Connection], None]) -> None:
        """Run ``body`` (insert into the mode's table, then a locking read of the other
        mode's table) in one transaction. Two adds of one name in different modes at the
        same time: each inserts, then waits for the other's row lock; MySQL breaks the
        deadlock by rolling one back, which is retried and then finds the other's row.
        SQLite serialises the two writers."""
        for attempt in range(3):
            try:
                with transaction(self.engine, f"{tag}: {what}", is_deadlock) as conn:
                    body(conn)
                return
            except IntegrityError as exc:
                raise TagExists(tag) from exc
            except DBAPIError as exc:
                if attempt == 2:
                    raise BackendUnavailable(f"database: {tag}: {what}: {exc.orig!r}") from exc
                log.info("%s: concurrent add in another mode, retrying (%s)", tag, exc.orig)

    @staticmethod
    def _refuse_if_in(conn: Connection, table: Table, tag: str) -> None:
        if not inspect(conn).has_table(table.name):
            return
        found = conn.execute(
            select(table.c.biz_tag).where(table.c.biz_tag == tag).with_for_update()
        ).first()
        if found is not None:
            raise TagExists(tag)

    def _ensure_own_tables(self, *tables: Table, what: str = "check leafpool's tables"
                           ) -> None:
        """leafpool's own ``tables`` (all by default) are there and readable, checked once
        per store and table (:func:`leafpool.database.schema.require`); never created
        here: ``leafpool db init`` is the one DDL path."""
        self._seen |= schema.require(self.engine, tables or OWN_TABLES, self._seen, what)

    # -- retired tags (G1 across a removal) ---------------------------------------------

    def retired_mark(self, tag: str) -> int:
        """The first ID a removed tag of this name never allocated (0 when none)."""
        self._ensure_own_tables(retired_tag)
        with self._tx(f"{tag}: read retired mark") as conn:
            return self._retired(conn, tag)

    @staticmethod
    def _retired(conn: Connection, tag: str) -> int:
        value = conn.execute(
            select(retired_tag.c.max_id).where(retired_tag.c.biz_tag == tag)
        ).scalar_one_or_none()
        return int(value) if value is not None else 0

    def retire(self, tag: str, mark: int) -> int:
        """Keep ``mark`` (the first ID never allocated) for ``tag`` durably; a larger mark
        already kept stays. Returns the kept mark."""
        self._ensure_own_tables(retired_tag)
        with self._tx(f"{tag}: retire") as conn:
            return self._retire(conn, tag, mark)

    @staticmethod
    def _retire(conn: Connection, tag: str, mark: int) -> int:
        row = conn.execute(
            select(retired_tag.c.max_id).where(retired_tag.c.biz_tag == tag).with_for_update()
        ).first()
        if row is None:
            conn.execute(retired_tag.insert().values(biz_tag=tag, max_id=mark))
            return mark
        kept = max(int(row.max_id), mark)
        conn.execute(retired_tag.update().where(retired_tag.c.biz_tag == tag)
                     .values(max_id=kept, retire_time=func.current_timestamp()))
        return kept

    # -- tags ---------------------------------------------------------------------------

    def add_tag(
        self, tag: str, step: int, start: int | None = None, description: str | None = None
    ) -> TagRow:
        """Register a tag whose first ID will be ``start``: by default 1, or, for a name
        that was removed before, the first ID the removed tag never allocated. An explicit
        ``start`` below that mark is refused (it would repeat IDs)."""
        validate_tag(tag)
        validate_step(step)
        if start is not None:
            validate_start(start, step)
        if description is not None and len(description) > 256:
            raise InvalidArgument("description", description, "at most 256 characters")
        chosen: list[int] = []

        def insert(conn: Connection) -> None:
            mark = self._retired(conn, tag)
            first = max(FIRST_ID, mark) if start is None else start
            if first < mark:
                raise InvalidArgument(
                    "start", start,
                    f"at least {mark}: a tag named {tag!r} was removed after handing out IDs "
                    f"below {mark}; leave --start out to continue from {mark}")
            validate_start(first, step)
            conn.execute(leaf_alloc.insert().values(
                biz_tag=tag, max_id=first, step=step, description=description))
            self._refuse_if_in(conn, snowflake_tag, tag)
            chosen.append(first)

        self._ensure_own_tables()
        self._add(tag, "insert", insert)
        return TagRow(tag, chosen[-1], step, description)

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

    def remove_tag(self, tag: str, pool_mark: int = 0) -> int:
        """Delete the tag's row and keep its mark (the larger of its ``max_id`` and
        ``pool_mark``, what the pool recorded) in ``leafpool_retired_tag``, in one
        transaction. Returns the kept mark."""
        self._ensure_own_tables()
        with self._tx(f"{tag}: delete") as conn:
            max_id = conn.execute(
                select(leaf_alloc.c.max_id).where(leaf_alloc.c.biz_tag == tag).with_for_update()
            ).scalar_one_or_none()
            if max_id is None:
                raise UnknownTag(tag)
            conn.execute(leaf_alloc.delete().where(leaf_alloc.c.biz_tag == tag))
            return self._retire(conn, tag, max(int(max_id), pool_mark))

    # -- allocation ---------------------------------------------------------------------

    def allocate(self, tag: str, rule: StepRule | None = None, floor: int = 0) -> Segment:
        """Advance ``max_id`` by one step and return the range ``[max_id - step, max_id)``.

        ``rule`` picks the step (dynamic step); by default the table's. ``floor`` is the
        first ID the caller may still hand out (the pool's mark); the range must start at
        or above it, above a removed tag's mark and at 1: otherwise
        :class:`CounterBehind` is raised and nothing is written. An advance that would
        pass 2**63 - 1 raises :class:`SegmentExhausted` and writes nothing.
        """
        self._ensure_own_tables(retired_tag, what=f"{tag}: allocate")
        started = self._monotonic()
        with self._tx(f"{tag}: allocate") as conn:
            row = conn.execute(
                select(leaf_alloc.c.max_id, leaf_alloc.c.step).where(leaf_alloc.c.biz_tag == tag)
            ).first()
            if row is None:
                raise UnknownTag(tag)
            retired = self._retired(conn, tag)
            lowest, why = max((FIRST_ID, "IDs start at 1"),
                              (retired, "a removed tag of this name handed out IDs below it"),
                              (floor, "the pool already holds or handed out IDs below it"))
            if int(row.max_id) < lowest:
                raise CounterBehind(tag, int(row.max_id), lowest, why)
            table_step = int(row.step)
            step = (rule or StepRule()).step(table_step)
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
        took = (self._monotonic() - started) * 1000
        log.debug("%s: allocated [%d, %d) step=%d in %.1f ms", tag, max_id - step, max_id,
                  step, took)
        return Segment(tag, max_id - step, max_id, step, table_step, took)

    # -- operator views -----------------------------------------------------------------

    def leaf_alloc_rows(self) -> list[tuple[TagRow, datetime | None]]:
        """Every ``leaf_alloc`` row by tag, with its ``update_time`` (Leaf's /db view)."""
        with self._tx("read leaf_alloc") as conn:
            rows = conn.execute(
                select(leaf_alloc.c.biz_tag, leaf_alloc.c.max_id, leaf_alloc.c.step,
                       leaf_alloc.c.description, leaf_alloc.c.update_time)
                .order_by(leaf_alloc.c.biz_tag)
            ).all()
        return [(TagRow(r.biz_tag, int(r.max_id), int(r.step), r.description), r.update_time)
                for r in rows]

    def ping(self) -> None:
        """``SELECT 1``: raises :class:`BackendUnavailable` unless the database answers."""
        with self._tx("ping") as conn:
            conn.execute(text("SELECT 1"))

    def leaf_alloc_missing(self) -> bool:
        """True when the database answers and has no ``leaf_alloc`` table (the operator's
        fault: a wrong URL, or ``leafpool db init`` never run); False when it has one or
        does not answer."""
        try:
            with self._tx("schema check") as conn:
                return not inspect(conn).has_table(leaf_alloc.name)
        except BackendUnavailable:
            return False
