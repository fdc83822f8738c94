"""Mode ``mysql``: worker IDs in the ``leaf_workerid_alloc`` table of NotFound9's Leaf
fork (DDL unchanged, ``leafpool/sql/mysql/leaf_workerid_alloc.sql``), in the database of
``LEAFPOOL_DATABASE_URL`` (MySQL or MariaDB).

Columns, as we use them:

- ``id``: the worker ID (NotFound9's holder uses the row id too). Rows are inserted with
  an explicit id, the lowest free one in 1..1023, so an id never passes 1023 (0 is
  never used: it means "next AUTO_INCREMENT value" to MySQL);
- ``ip_port``: the identity (unique), ``ip``: its host part;
- ``port``: the claim token of the current holder: every write is conditional on it,
  so a process whose row was taken over (recycled, or re-claimed by a new process of
  the same identity) cannot write any more;
- ``max_timestamp``: the high-water mark, only ever raised while held;
- ``update_time``: the lease: set to the database's ``NOW()`` by every renew and
  :meth:`record_high_water`, ``NULL`` after a clean release.

A claim (one transaction, rows locked) reuses the identity's row, else inserts a row with
the lowest free id, else recycles the row whose lease expired longest ago
(``update_time`` older than ``snowflake_lease_seconds`` by the database clock), else
refuses: never a wrap into a duplicate. An identity whose row is still leased by another
live process is refused too.

The holder renews every ``snowflake_renew_seconds`` and fences itself when no renew
succeeded within 2/3 of the lease (:class:`~leafpool.registry.timing.LeaseDeadline`); a
recycler waits for the whole lease to pass by the database's clock.

When the database is unreachable at start, the cache file supplies the worker ID (same
clock check) but only while the lease it recorded is still running: until then no one
can recycle the row. The holder keeps trying to renew and fences itself when that lease
runs out first.
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    MetaData,
    String,
    Table,
    and_,
    case,
    func,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.mysql import TIMESTAMP
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

from leafpool.config import Settings
from leafpool.db import ddl_statement, make_engine, transaction
from leafpool.errors import BackendUnavailable, ConfigurationError, WorkerIdUnavailable
from leafpool.registry.base import BaseRegistry, Lease, Start
from leafpool.registry.cache import CacheRecord
from leafpool.snowflake import MAX_WORKER_ID

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 5
MYSQL_DEADLOCK = {1205, 1213}  # lock wait timeout, deadlock: retry the claim

#: NotFound9's DDL (columns, types and index unchanged), without its DROP TABLE.
DDL = ddl_statement("mysql", "leaf_workerid_alloc")

metadata = MetaData()
workerid_alloc = Table(
    "leaf_workerid_alloc",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("ip", String(127)),
    Column("port", String(127)),
    Column("ip_port", String(127), nullable=False, unique=True),
    Column("max_timestamp", BigInteger),
    Column("create_time", TIMESTAMP, nullable=True),
    Column("update_time", TIMESTAMP, nullable=True),
)
_t = workerid_alloc


def init_schema(engine: Engine) -> None:
    """Create ``leaf_workerid_alloc`` unless it exists."""
    try:
        with engine.begin() as conn:
            conn.execute(text(DDL))
    except SQLAlchemyError as exc:
        raise BackendUnavailable(f"database: creating leaf_workerid_alloc failed: {exc}") from exc


class MySqlRegistry(BaseRegistry):
    mode = "mysql"
    leased = True

    def __init__(self, settings: Settings, identity: str, *, engine: Engine | None = None,
                 create_table: bool = True, **kwargs: Any) -> None:
        super().__init__(settings, identity, **kwargs)
        url = settings.database_url
        if engine is None:
            if make_url(url).get_backend_name() != "mysql":
                raise ConfigurationError(
                    "LEAFPOOL_DATABASE_URL", url,
                    "snowflake mode mysql needs a MySQL/MariaDB URL (mysql+pymysql://...)",
                )
            engine = make_engine(url)
        self.engine = engine
        self.create_table = create_table
        self.lease_db_s = max(1, math.ceil(settings.snowflake_lease_seconds))
        self.degraded = False  # started from the cache file: MySQL was unreachable

    def _tx(self, what: str) -> AbstractContextManager[Connection]:
        """A deadlock goes up as it is (the caller retries); other driver errors become
        BackendUnavailable."""
        return transaction(self.engine, f"{self.identity}: {what}", passthrough=_deadlock)

    def _expired(self) -> Any:
        cutoff = func.timestampadd(literal_column("SECOND"), -self.lease_db_s, func.now())
        return or_(_t.c.update_time.is_(None), _t.c.update_time < cutoff)

    def _ours(self, lease: Lease) -> Any:
        """The row of ``lease``, while this process holds it."""
        return and_(_t.c.id == lease.worker_id, _t.c.ip_port == self.identity,
                    _t.c.port == self.token)

    # -- claim --------------------------------------------------------------------------

    def _acquire(self, cached: CacheRecord | None) -> Start:
        assert self.deadline is not None
        try:
            if self.create_table:
                init_schema(self.engine)
            for _attempt in range(CLAIM_ATTEMPTS):
                sent, sent_wall = self.monotonic(), self.clock()
                try:
                    with self._tx("claim") as conn:
                        start = self._claim_in(conn, cached)
                except (IntegrityError, OperationalError) as exc:  # a race, or a deadlock
                    log.info("%s: claim raced another process (%s); retrying", self.identity,
                             exc.orig)
                    continue
                self.degraded = False
                self.deadline.renewed(sent, sent_wall)
                return start
            raise WorkerIdUnavailable(f"{self.identity}: claim kept racing; gave up after "
                                      f"{CLAIM_ATTEMPTS} attempts")
        except BackendUnavailable as exc:
            start = self._cached_start(f"MySQL unreachable ({exc})", exc, cached)
            self.degraded = True
            return start

    def _claim_in(self, conn: Connection, cached: CacheRecord | None) -> Start:
        expired = case((self._expired(), 1), else_=0).label("expired")
        row = conn.execute(
            select(_t, expired).where(_t.c.ip_port == self.identity).with_for_update()
        ).first()
        if row is not None:
            worker_id, recorded, how = int(row.id), int(row.max_timestamp or 0), "reused"
            if worker_id > MAX_WORKER_ID:
                raise WorkerIdUnavailable(
                    f"{self.identity}: its leaf_workerid_alloc row has id {worker_id}, above "
                    f"{MAX_WORKER_ID}; delete that row so a valid worker ID can be assigned"
                )
            ours = (cached is not None and bool(cached.token) and row.port == cached.token
                    and cached.writer_gone())
            if not row.expired and not ours:
                raise WorkerIdUnavailable(
                    f"{self.identity}: identity in use: its worker {worker_id} is leased by "
                    f"another live process (renewed at {row.update_time}); two processes "
                    f"must not share an identity (retry after {self.lease_db_s}s)"
                )
        else:
            worker_id, recorded, how = self._new_row(conn)
        start = self._start(worker_id, recorded, f"MySQL leaf_workerid_alloc id={worker_id}",
                            cached, "mysql")
        conn.execute(_t.update().where(_t.c.id == worker_id).values(
            ip=self.host, port=self.token, max_timestamp=start.mark, update_time=func.now()))
        log.info("%s: worker %d %s from leaf_workerid_alloc", self.identity, worker_id, how)
        return start

    def _new_row(self, conn: Connection) -> tuple[int, int, str]:
        used = set(conn.execute(
            select(_t.c.id).where(_t.c.id <= MAX_WORKER_ID).with_for_update()
        ).scalars())
        free = next((i for i in range(1, MAX_WORKER_ID + 1) if i not in used), None)
        if free is not None:
            conn.execute(_t.insert().values(
                id=free, ip=self.host, port=self.token, ip_port=self.identity,
                max_timestamp=0, create_time=func.now(), update_time=func.now()))
            return free, 0, "inserted"
        victim = conn.execute(
            select(_t).where(_t.c.id <= MAX_WORKER_ID, self._expired())
            .order_by(_t.c.update_time, _t.c.id).limit(1).with_for_update()
        ).first()
        if victim is None:
            raise WorkerIdUnavailable(
                f"{self.identity}: all {MAX_WORKER_ID} worker IDs of leaf_workerid_alloc "
                f"(1..{MAX_WORKER_ID}) are leased by live processes (renewed within "
                f"{self.lease_db_s}s); none can be recycled"
            )
        conn.execute(_t.update().where(_t.c.id == victim.id).values(
            ip_port=self.identity, ip=self.host, port=self.token, update_time=func.now()))
        log.warning("%s: recycling worker %d from %r (lease expired at %s)", self.identity,
                    victim.id, victim.ip_port, victim.update_time)
        return int(victim.id), int(victim.max_timestamp or 0), f"recycled from {victim.ip_port!r}"

    # -- running ------------------------------------------------------------------------

    def _renew(self, lease: Lease, ms: int) -> bool:
        """Raise the mark to ``ms`` and renew the lease, if the row is still ours."""
        assert self.deadline is not None
        sent, sent_wall = self.monotonic(), self.clock()
        with self._tx("renew") as conn:
            result = conn.execute(_t.update().where(self._ours(lease)).values(
                max_timestamp=func.greatest(func.coalesce(_t.c.max_timestamp, 0), ms),
                update_time=func.now()))
        if result.rowcount == 0:
            self._fence(f"leaf_workerid_alloc id={lease.worker_id} was taken over by "
                        "another process")
            self.check()
        self.deadline.renewed(sent, sent_wall)
        if self.degraded:
            log.info("%s: MySQL reachable again; worker %d renewed", self.identity,
                     lease.worker_id)
            self.degraded = False
        return True

    def _write_mark(self, lease: Lease, ms: int) -> None:
        try:
            self._renew(lease, ms)
        except BackendUnavailable:
            if not self.degraded:
                raise
            self.check()  # within the cached lease: the cache file holds the mark
            log.warning("%s: worker %d: high-water %d recorded in the cache file only "
                        "(MySQL unreachable)", self.identity, lease.worker_id, ms)

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        try:
            with self._tx("release") as conn:
                conn.execute(_t.update().where(self._ours(lease)).values(
                    max_timestamp=final_ms, update_time=None))
        except BackendUnavailable as exc:
            log.warning("%s: release of worker %d failed: %s", self.identity,
                        lease.worker_id, exc)

    def _close(self) -> None:
        self.engine.dispose()


def _deadlock(exc: DBAPIError) -> bool:
    if not isinstance(exc, OperationalError):
        return False
    args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
    return bool(args) and args[0] in MYSQL_DEADLOCK
