"""The segment store: Leaf's ``leaf_alloc`` table in MySQL/MariaDB (or SQLite, the
embedded default), reached through SQLAlchemy.

The one write on the hot path is Leaf's allocation: advance ``max_id`` by the step in
one transaction that holds the row's lock from its read; the range handed out is
``[max_id - step, max_id)`` (docs/design.md §2, G3). The table is Leaf's DDL unchanged,
so a database a Leaf server already uses (rows inserted by hand included) works as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import Connection, Engine, Table, func, inspect, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from leafpool.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    LeafpoolError,
    TagExists,
    UnknownTag,
)
from leafpool.core.setting_values import hide_password
from leafpool.core.tags import validate_tag
from leafpool.core.tls import TlsFiles
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
from leafpool.database.guard import tag_guard, write_guard
from leafpool.segment import allocation, counter, guards
from leafpool.segment.counter import FIRST_ID as FIRST_ID
from leafpool.segment.step import StepRule
from leafpool.segment.values import Segment as Segment
from leafpool.segment.values import TagRow as TagRow
from leafpool.segment.values import validate_start as validate_start
from leafpool.segment.values import validate_step as validate_step

log = logging.getLogger(__name__)

#: leafpool's tables a tag add or removal reads and writes
TABLES = (*OWN_TABLES, tag_guard)


class SegmentStore:
    """Tags and segment allocation in ``leaf_alloc``. ``slot``: mode own's slot of this
    DC (docs/design.md §12.3; :func:`leafpool.segment.counter.own_slot`): tags begin in
    it, counters below it are moved up into it, nothing is allocated outside it."""

    def __init__(self, engine: Engine,
                 monotonic: Callable[[], float] = time.monotonic,
                 slot: counter.DcSlot | None = None) -> None:
        self.engine = engine
        self._monotonic = monotonic
        self.slot = slot
        self._seen: set[str] = set()  # own tables found there (``_ensure_own_tables``)

    @classmethod
    def from_url(cls, url: str, tls: TlsFiles | None = None,
                 slot: counter.DcSlot | None = None) -> SegmentStore:
        """A store on ``url``; ``tls``: the database's TLS (``Settings.database_tls_used``);
        ``slot``: this DC's in mode own."""
        try:
            return cls(make_engine(url, tls=tls), slot=slot)
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
        leafpool's own tables (:data:`TABLES`)."""
        created = schema.create(self.engine)  # the one DDL path (`leafpool db init`)
        self._seen = {table.name for table in TABLES}
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
        self._seen |= schema.require(self.engine, tables or TABLES, self._seen, what)

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
        self, tag: str, step: int, start: int | None = None, description: str | None = None,
        guard: str | None = None,
    ) -> TagRow:
        """Register a tag whose first ID will be ``start``: by default 1, or, for a name
        that was removed before, the first ID the removed tag never allocated, or one above
        what its ``guard`` (``TABLE.COLUMN``, docs/design.md §7.3) reads; in mode own
        the DC's slot's start + 1 at least. An explicit ``start`` below any of these is
        refused (it would repeat IDs), and so is one whose first segment leaves the slot."""
        validate_tag(tag)
        validate_step(step)
        if start is not None:
            validate_start(start, step)
        if description is not None and len(description) > 256:
            raise InvalidArgument("description", description, "at most 256 characters")
        checked = guards.checked(self.engine, guard) if guard is not None else None
        stored = checked[1] if checked else None
        chosen: list[int] = []

        def insert(conn: Connection) -> None:
            mark = self._retired(conn, tag)
            low = counter.lowest(0, mark, counter.Stored(guard or "", stored), self.slot)
            first = low.value if start is None else start
            if first < low.value:
                raise InvalidArgument(
                    "start", start, f"at least {low.value}: {low.why}; leave --start out to "
                                    f"begin at {low.value}")
            validate_start(first, step)
            if self.slot is not None and first + step > self.slot.end:
                raise InvalidArgument(
                    "start", first, f"at most {self.slot.end - step} so one step of {step} "
                                    f"fits in {self.slot} (LEAFPOOL_DC_SEGMENTS=own)")
            conn.execute(leaf_alloc.insert().values(
                biz_tag=tag, max_id=first, step=step, description=description))
            self._refuse_if_in(conn, snowflake_tag, tag)
            write_guard(conn, tag, checked[0] if checked else None)
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
        """Delete the tag's row and its guard, and keep its mark (the larger of its
        ``max_id`` and ``pool_mark``, what the pool recorded) in ``leafpool_retired_tag``,
        in one transaction. Returns the kept mark."""
        self._ensure_own_tables()
        with self._tx(f"{tag}: delete") as conn:
            max_id = conn.execute(
                select(leaf_alloc.c.max_id).where(leaf_alloc.c.biz_tag == tag).with_for_update()
            ).scalar_one_or_none()
            if max_id is None:
                raise UnknownTag(tag)
            conn.execute(leaf_alloc.delete().where(leaf_alloc.c.biz_tag == tag))
            write_guard(conn, tag, None)
            return self._retire(conn, tag, max(int(max_id), pool_mark))

    # -- allocation ---------------------------------------------------------------------

    def allocate(self, tag: str, rule: StepRule | None = None, floor: int = 0,
                 heal: bool = False) -> Segment:
        """Advance ``max_id`` by one step and return the range ``[max_id - step, max_id)``.

        ``rule`` picks the step (dynamic step); by default the table's. ``floor`` is the
        first ID the caller may still hand out (the pool's mark; 0: the pool has none, so
        the tag's guard is read). The range starts at or above the floor, a removed tag's
        mark, one above the guard's reading, and 1. A ``max_id`` below that is moved up
        to it with ``heal`` (``healed_from`` on the segment), otherwise
        :class:`CounterBehind` is raised and nothing is written. The row is read with
        its lock held until the commit, so no other writer changes it in between
        (docs/design.md §7.3). An advance that would pass 2**63 - 1 raises
        :class:`SegmentExhausted` and writes nothing. In mode own (``slot``) the slot's
        first ID is one more floor (a counter below it is healed up into it), and a
        counter in another DC's slot or a step past the slot's end raises
        :class:`OutsideDcSlot` and writes nothing (docs/design.md §12.3).
        """
        self._ensure_own_tables(retired_tag, what=f"{tag}: allocate")
        started = self._monotonic()
        with self._tx(f"{tag}: allocate") as conn:
            done = self._allocate_locked(conn, tag, rule, floor, heal)
        return allocation.allocated(tag, done, (self._monotonic() - started) * 1000)

    def allocate_many(
        self, requests: Sequence[tuple[str, StepRule | None, int, bool]]
    ) -> dict[str, Segment | LeafpoolError]:
        """:meth:`allocate` for many tags (``(tag, rule, floor, heal)`` each, a tag at most
        once) in ONE transaction: the batched first fill of new tags (docs/design.md §4).

        Each tag gets exactly :meth:`allocate`'s checks and its one atomic ``max_id``
        advance, on its row locked (``SELECT ... FOR UPDATE``) until the one commit. The
        rows are locked in sorted tag order, so two batches of overlapping tags wait for
        each other and never deadlock. A tag refused (:class:`CounterBehind`,
        :class:`OutsideDcSlot`, :class:`UnknownTag`, :class:`SegmentExhausted`, any
        :class:`LeafpoolError` raised before its write) writes nothing and fails alone:
        its error is its entry. A database error fails the whole transaction (nothing
        committed): :class:`BackendUnavailable` is raised. Each segment's ``took_ms`` is
        the transaction's time shared among its tags (the latency one allocation sees)."""
        return allocation.allocate_many(self, requests)

    def _allocate_locked(self, conn: Connection, tag: str, rule: StepRule | None, floor: int,
                         heal: bool) -> allocation.Decided:
        """One allocation's reads and its one write inside the caller's transaction."""
        row = counter.lock_row(conn, tag)
        done = allocation.decide(tag, row, self._retired(conn, tag),
                                 lambda: self._guard_reading(conn, tag), rule, floor, heal,
                                 self.slot)
        counter.advance(conn, tag, done[4] - done[3], done[3])
        return done

    # -- guards (docs/design.md §7.3) ---------------------------------------------------

    def _guard_reading(self, conn: Connection, tag: str) -> counter.Stored | None:
        if tag_guard.name not in self._seen and \
                schema.probe(self.engine, tag_guard, f"{tag}: read the guard") == "absent":
            # a database from before guards, where `leafpool db init` has not run again:
            # nobody can have set a guard, so there is none to read (an upgrade needs no
            # step); a table this user may not read is refused below
            return None
        self._ensure_own_tables(tag_guard, what=f"{tag}: read the guard")
        return guards.reading(conn, tag)

    def set_guard(self, tag: str, guard: str | None) -> int | None:
        """Set the segment tag's guard (``TABLE.COLUMN`` or ``SCHEMA.TABLE.COLUMN``,
        checked by reading it once: what it reads now is returned), or clear it (None)."""
        validate_tag(tag)
        checked = guards.checked(self.engine, guard) if guard is not None else None
        self._ensure_own_tables(tag_guard, what=f"{tag}: set the guard")
        with self._tx(f"{tag}: set the guard") as conn:
            found = conn.execute(select(leaf_alloc.c.biz_tag).where(
                leaf_alloc.c.biz_tag == tag).with_for_update()).first()
            if found is None:
                raise UnknownTag(tag)
            write_guard(conn, tag, checked[0] if checked else None)
        return checked[1] if checked else None

    def guard(self, tag: str) -> counter.Stored | None:
        """The tag's guard and what it reads now (None: no guard); :class:`GuardFailed`
        when it cannot be read."""
        with self._tx(f"{tag}: read the guard") as conn:
            return self._guard_reading(conn, tag)

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

