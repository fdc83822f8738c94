"""Mode ``mysql``: worker IDs in NotFound9's ``leaf_workerid_alloc`` table (DDL unchanged,
``leafpool/database/sql/mysql/leaf_workerid_alloc.sql``) in the database of
``LEAFPOOL_DATABASE_URL`` (MySQL or MariaDB), the IDs of the DC's range (1..1023 with
one DC), the layout the database serves in ``leafpool_snowflake_layout``
(docs/design.md §12.1). How its columns are used, the claim, the
lease and a start without the database: docs/design.md §8.4.
"""

from __future__ import annotations

import contextlib
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
    inspect,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.mysql import TIMESTAMP
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from leafpool.core.config import Settings, hide_password
from leafpool.core.errors import BackendUnavailable, ConfigurationError, WorkerIdUnavailable
from leafpool.database.engine import (
    DriverTimeouts,
    ddl_statement,
    make_engine,
    parse_url,
    transaction,
)
from leafpool.database.layout_table import WORKERID_REGISTRY, snowflake_layout
from leafpool.database.schema import probe
from leafpool.snowflake.registry import layout
from leafpool.snowflake.registry.base import BaseRegistry, Lease, Start
from leafpool.snowflake.registry.cache import CacheRecord

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 5

#: the registry's driver timeouts: its statements touch one row (or the table's 1,023 at
#: a claim), so a database that has not answered in two seconds is down or stopped, and a
#: record or renew fails in seconds instead of holding a refill up (a call may take two
#: reads: the pool's ping, then a new connection's greeting)
REGISTRY_TIMEOUTS = DriverTimeouts(connect=2, read=2, write=2)

#: NotFound9's DDL (columns, types and index unchanged), without its DROP TABLE.
DDL = ddl_statement("mysql", "leaf_workerid_alloc")

#: the table, as the queries below name it
_t = Table(
    "leaf_workerid_alloc",
    MetaData(),
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("ip", String(127)),
    Column("port", String(127)),
    Column("ip_port", String(127), nullable=False, unique=True),
    Column("max_timestamp", BigInteger),
    Column("create_time", TIMESTAMP, nullable=True),
    Column("update_time", TIMESTAMP, nullable=True),
)


class MySqlRegistry(BaseRegistry):
    mode = "mysql"
    leased = True

    def __init__(
        self,
        settings: Settings,
        identity: str,
        *,
        engine: Engine | None = None,
        create_table: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(settings, identity, **kwargs)
        url = settings.database_url
        if engine is None:
            if parse_url(url).get_backend_name() != "mysql":
                raise ConfigurationError(
                    "LEAFPOOL_DATABASE_URL",
                    hide_password(url),
                    "snowflake mode mysql needs a MySQL/MariaDB URL (mysql+pymysql://...)",
                )
            engine = make_engine(url, REGISTRY_TIMEOUTS, settings.database_tls_used)
        self.engine = engine
        self.create_table = create_table
        self.lease_db_s = max(1, math.ceil(settings.snowflake_lease_seconds))
        self._layout_readable = False  # leafpool_snowflake_layout is there for this user

    def _tx(self, what: str) -> AbstractContextManager[Connection]:
        """A deadlock goes up as it is (the caller retries); other driver errors become
        BackendUnavailable."""
        return transaction(self.engine, f"{self.identity}: {what}", passthrough=_deadlock)

    def _expired(self) -> Any:
        cutoff = func.timestampadd(literal_column("SECOND"), -self.lease_db_s, func.now())
        return or_(_t.c.update_time.is_(None), _t.c.update_time < cutoff)

    def _ours(self, lease: Lease) -> Any:
        """The row of ``lease``, while this process holds it."""
        return and_(
            _t.c.id == lease.worker_id, _t.c.ip_port == self.identity, _t.c.port == self.token
        )

    # -- claim --------------------------------------------------------------------------

    def _acquire(self, cached: CacheRecord | None) -> Start:
        try:
            if self.create_table:  # only when missing: a worker's user has no CREATE
                with self._tx("creating leaf_workerid_alloc") as conn:
                    if not inspect(conn).has_table(_t.name):
                        conn.execute(text(DDL))
            self._check_layout()
            for _attempt in range(CLAIM_ATTEMPTS):
                try:
                    with self.deadline.renewing(), self._tx("claim") as conn:
                        return self._claim_in(conn, cached)
                except (IntegrityError, OperationalError) as exc:  # a race, or a deadlock
                    log.info(
                        "%s: claim raced another process (%s); retrying", self.identity, exc.orig
                    )
            raise WorkerIdUnavailable(
                f"{self.identity}: claim kept racing; gave up after {CLAIM_ATTEMPTS} attempts"
            )
        except BackendUnavailable as exc:
            return self._cached_start(f"MySQL unreachable ({exc})", exc, cached)

    def _check_layout(self) -> None:
        """Compare the database's DC layout record (``leafpool_snowflake_layout``) with
        this process's settings, writing it when there is none (docs/design.md §12.1).
        A database whose table this user cannot see (``db init`` of the previous
        release, or its grants) is taken as DC 0 of 1, as before the record, by a
        process of that layout; any other layout needs the table."""
        where = f"MySQL {snowflake_layout.name} registry='{WORKERID_REGISTRY}'"
        t = snowflake_layout
        what = f"{self.identity}: DC layout check"
        found = probe(self.engine, t, what)
        if found == "absent" and self.create_table:  # a worker's user has no CREATE
            # denied (no CREATE), or made meanwhile: the probe says which
            with contextlib.suppress(BackendUnavailable), self._tx(f"creating {t.name}") as conn:
                t.create(conn)
            found = probe(self.engine, t, what)
        self._layout_readable = found == "readable"
        if found != "readable":
            if (self.dc.dc_id, self.dc.dc_count) == layout.UNRECORDED:
                log.warning("%s: the %s table is %s, so the DC layout is not recorded (run "
                            "leafpool db init, and grant the worker leafpool db grants "
                            "worker); serving DC 0 of 1 as before", self.identity, t.name,
                            found)
                return
            raise ConfigurationError(
                layout.DC_COUNT_ENV, self.dc.dc_count,
                f"needs the {t.name} table to record the DC layout this database serves, "
                f"and it is {found} to this user: run leafpool db init, then the grants of "
                "leafpool db grants worker")
        with self._tx("DC layout check") as conn:
            chosen = select(t.c.dc_id, t.c.dc_count).where(t.c.registry == WORKERID_REGISTRY)
            row = conn.execute(chosen).first()
            if row is None:
                count = conn.execute(select(func.count()).select_from(_t)).scalar_one()
                history = f"{count} rows of {_t.name}" if count else None
                layout.check(self.dc, None, where, history)
                conn.execute(t.insert().prefix_with("IGNORE").values(
                    registry=WORKERID_REGISTRY, dc_id=self.dc.dc_id,
                    dc_count=self.dc.dc_count, written_by=self.identity))
                row = conn.execute(chosen).one()  # ours, or a racing worker's
            layout.check(self.dc, (int(row.dc_id), int(row.dc_count)), where, None)

    def _claim_in(self, conn: Connection, cached: CacheRecord | None) -> Start:
        if self._layout_readable:  # the record again, share-locked for the claim: a
            t = snowflake_layout   # `snowflake layout --set` holds it for update
            record = conn.execute(select(t.c.dc_id, t.c.dc_count).where(
                t.c.registry == WORKERID_REGISTRY).with_for_update(read=True)).first()
            if record is not None:
                where = f"MySQL {t.name} registry='{WORKERID_REGISTRY}'"
                layout.check(self.dc, (int(record.dc_id), int(record.dc_count)), where, None)
        expired = case((self._expired(), 1), else_=0).label("expired")
        row = conn.execute(
            select(_t, expired).where(_t.c.ip_port == self.identity).with_for_update()
        ).first()
        if row is not None:
            worker_id, recorded, how = int(row.id), int(row.max_timestamp or 0), "reused"
            if worker_id not in self.dc:
                raise WorkerIdUnavailable(
                    f"{self.identity}: its leaf_workerid_alloc row has id {worker_id}, outside "
                    f"{self.dc.describe()}; delete that row so a worker ID of the range can "
                    "be assigned"
                )
            gone = cached is not None and cached.left_by_gone_writer(row.port)
            if not row.expired and not gone:
                raise WorkerIdUnavailable(
                    f"{self.identity}: identity in use: its worker {worker_id} is leased by "
                    f"another live process (renewed at {row.update_time}); two processes "
                    f"must not share an identity (retry after {self.lease_db_s}s)"
                )
        else:
            worker_id, recorded, how = self._new_row(conn)
        start = self._start(
            worker_id, recorded, f"MySQL leaf_workerid_alloc id={worker_id}", cached, "mysql"
        )
        conn.execute(
            _t.update()
            .where(_t.c.id == worker_id)
            .values(ip=self.host, port=self.token, max_timestamp=start.mark, update_time=func.now())
        )
        log.info("%s: worker %d %s from leaf_workerid_alloc", self.identity, worker_id, how)
        return start

    def _new_row(self, conn: Connection) -> tuple[int, int, str]:
        """A free ID of the DC's range (0 excluded, as NotFound9's table starts at 1),
        else the row of the range whose lease expired longest ago."""
        low, high = max(1, self.dc.first), self.dc.last
        in_range = _t.c.id.between(low, high)
        used = set(conn.execute(select(_t.c.id).where(in_range).with_for_update()).scalars())
        free = next((i for i in range(low, high + 1) if i not in used), None)
        if free is not None:  # the claim fills in the rest
            conn.execute(_t.insert().values(id=free, ip_port=self.identity, create_time=func.now()))
            return free, 0, "inserted"
        victim = conn.execute(
            select(_t)
            .where(in_range, self._expired())
            .order_by(_t.c.update_time, _t.c.id)
            .limit(1)
            .with_for_update()
        ).first()
        if victim is None and low > high:
            raise WorkerIdUnavailable(
                f"{self.identity}: {self.dc.describe()}: its one worker ID, 0, is never "
                "leased in mode mysql (leaf_workerid_alloc starts at 1): no worker ID to "
                f"claim (LEAFPOOL_DC_COUNT={self.dc.dc_count}); use a lower count"
            )
        if victim is None:
            raise WorkerIdUnavailable(
                f"{self.identity}: {self.dc.describe()}: all {high - low + 1} worker IDs of "
                f"leaf_workerid_alloc ({low}..{high}) are leased by live processes (renewed "
                f"within {self.lease_db_s}s); none can be recycled (LEAFPOOL_DC_COUNT="
                f"{self.dc.dc_count})"
            )
        conn.execute(_t.update().where(_t.c.id == victim.id).values(ip_port=self.identity))
        log.warning(
            "%s: recycling worker %d from %r (lease expired at %s)",
            self.identity,
            victim.id,
            victim.ip_port,
            victim.update_time,
        )
        return int(victim.id), int(victim.max_timestamp or 0), f"recycled from {victim.ip_port!r}"

    # -- running ------------------------------------------------------------------------

    def _renew(self, lease: Lease, ms: int) -> bool:
        """Raise the mark to ``ms`` and renew the lease, if the row is still ours."""
        with self.deadline.renewing():
            with self._tx("renew") as conn:
                result = conn.execute(
                    _t.update()
                    .where(self._ours(lease))
                    .values(
                        max_timestamp=func.greatest(func.coalesce(_t.c.max_timestamp, 0), ms),
                        update_time=func.now(),
                    )
                )
            if result.rowcount == 0:
                self._fence(
                    f"leaf_workerid_alloc id={lease.worker_id} was taken over by another process"
                )
                self.check()
        if self.degraded:
            log.info("%s: MySQL reachable again; worker %d renewed", self.identity, lease.worker_id)
            self.degraded = False
        return True

    def _write_mark(self, lease: Lease, ms: int) -> None:
        """A record beyond the mark the row holds: raise it and renew (MySQL unreachable:
        :class:`BackendUnavailable`; records the row's mark covers need no write, which
        is how the holder rides through an outage while its lease runs)."""
        self._renew(lease, ms)

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        try:
            with self._tx("release") as conn:
                conn.execute(
                    _t.update()
                    .where(self._ours(lease))
                    .values(max_timestamp=final_ms, update_time=None)
                )
        except BackendUnavailable as exc:
            log.warning("%s: release of worker %d failed: %s", self.identity, lease.worker_id, exc)

    def _close(self) -> None:
        self.engine.dispose()


def _deadlock(exc: DBAPIError) -> bool:
    """A lock wait timeout (MySQL error 1205) or a deadlock (1213): the claim is retried."""
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return isinstance(exc, OperationalError) and bool(args) and args[0] in (1205, 1213)
