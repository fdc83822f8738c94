"""The database boundary: engines, transactions, driver errors, and the tables.

Every DDL has one home. Leaf's and NotFound9's tables are kept as their SQL files under
``leafpool/database/sql/<dialect>/`` (unchanged, so a database a Leaf server uses works as it is);
docker-compose mounts ``leafpool/database/sql/mysql`` as MySQL's init scripts, and the code runs
the same files. leafpool's own tables are defined here with SQLAlchemy, which writes the
DDL for each dialect (``leafpool db init`` creates them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from leafpool.core.errors import BackendUnavailable
from leafpool.core.setting_values import split_database_hosts
from leafpool.core.tls import TlsFiles
from leafpool.database.hosts import spread

SQL_DIR = Path(__file__).parent / "sql"
MYSQL_DEADLOCK = 1213
MYSQL_LOCK_WAIT_TIMEOUT = 1205
MYSQL_ACCESS_DENIED = 1045
MYSQL_INSECURE_TRANSPORT = 3159

metadata = MetaData()

# Leaf's table (created from leafpool/database/sql/<dialect>/leaf_alloc.sql; described here for
# queries only).
leaf_alloc = Table(
    "leaf_alloc",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False, server_default=""),
    Column("max_id", BigInteger, nullable=False, server_default="1"),
    Column("step", Integer, nullable=False),
    Column("description", String(256), nullable=True),
    Column("update_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)

# leafpool's own: the tags served in snowflake mode.
snowflake_tag = Table(
    "leafpool_snowflake_tag",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False),
    Column("description", String(256), nullable=True),
    Column("create_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)

# leafpool's own: the mark of every removed segment tag, kept after its leaf_alloc row
# and its Redis keys are gone, so a tag added again under the same name (by `leafpool tag
# add` or by hand in SQL) never hands out an ID it handed out before (docs/design.md §4).
# ``max_id`` is the first ID the old tag never allocated.
retired_tag = Table(
    "leafpool_retired_tag",
    metadata,
    Column("biz_tag", String(128), primary_key=True, nullable=False),
    Column("max_id", BigInteger, nullable=False),
    Column("retire_time", DateTime, nullable=False, server_default=func.current_timestamp()),
)

OWN_TABLES = (snowflake_tag, retired_tag)


def ddl_file(dialect: str, table: str) -> Path:
    """The shipped SQL file creating ``table`` (``mysql`` serves MariaDB too)."""
    return SQL_DIR / ("mysql" if dialect == "mysql" else "sqlite") / f"{table}.sql"


def ddl_statement(dialect: str, table: str) -> str:
    """The statement of :func:`ddl_file`, without its comment lines and final ``;``."""
    lines = ddl_file(dialect, table).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("--")).strip().rstrip(";")


def parse_url(url: str) -> URL:
    """SQLAlchemy's :class:`URL` of ``url``; of its first host when it names several
    (``host1:port,host2:port``: :func:`leafpool.database.hosts.spread`)."""
    return make_url(split_database_hosts(url)[0])


@dataclass(frozen=True)
class DriverTimeouts:
    """The MySQL driver's timeouts, in seconds: a server that is down refuses a connect at
    once, but a stopped one (SIGSTOP, a frozen VM, a blackholed link) accepts the TCP
    connection in the kernel and then never answers, so only these end a call to it. A
    call can take two of them (the pool's ping of a pooled connection, then the greeting
    of a new one, each a read)."""

    connect: float
    read: float
    write: float

    def connect_args(self) -> dict[str, object]:
        """``connect_args`` of a MySQL/MariaDB engine (PyMySQL's names)."""
        return {"connect_timeout": self.connect, "read_timeout": self.read,
                "write_timeout": self.write}


#: the segment store's: an allocation is one short transaction, but it may wait for row
#: locks held by other refillers and Leaf servers (docs/design.md §3.8)
STORE_TIMEOUTS = DriverTimeouts(connect=5, read=15, write=15)


def make_engine(url: str, timeouts: DriverTimeouts = STORE_TIMEOUTS,
                tls: TlsFiles | None = None) -> Engine:
    """An engine with short connect timeouts, so a database outage is noticed in seconds
    (MySQL/MariaDB: ``timeouts``); for a URL naming several hosts, one that moves to the
    next host when the one in use fails (:mod:`leafpool.database.hosts`). ``tls``
    (``LEAFPOOL_DATABASE_TLS=true``: ``Settings.database_tls_used``): every connection
    speaks TLS, the server's certificate verified (PyMySQL's ``ssl``: an
    :class:`ssl.SSLContext` of :mod:`leafpool.core.tls`)."""
    url, hosts = split_database_hosts(url)
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
        connect_args = timeouts.connect_args()
        if tls is not None:
            connect_args["ssl"] = tls.context()
    engine = create_engine(url, pool_pre_ping=True, pool_recycle=1800,
                           connect_args=connect_args)
    if hosts:
        spread(engine, hosts)
    return engine


def tls_hint(exc: DBAPIError) -> str:
    """What setting an OpenSSL error points to (its own words rarely say): a server
    certificate not trusted, or a server that wants TLS from a client without it."""
    text = str(exc.orig)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (" (the server's certificate: is its CA in LEAFPOOL_DATABASE_TLS_CA_FILE, "
                "and does it name the host? LEAFPOOL_DATABASE_TLS_CHECK_HOSTNAME)")
    if driver_code(exc) in (MYSQL_ACCESS_DENIED, MYSQL_INSECURE_TRANSPORT):
        return (" (the password; or TLS, which the server (require_secure_transport) or "
                "the user (REQUIRE SSL, X509) asks for: LEAFPOOL_DATABASE_TLS=true, "
                "LEAFPOOL_DATABASE_TLS_CERT_FILE and _KEY_FILE)")
    return ""


def driver_code(exc: DBAPIError) -> object:
    """The driver's error code (MySQL's number), or None."""
    args: tuple[object, ...] = tuple(getattr(exc.orig, "args", ()))
    return args[0] if args else None


def is_deadlock(exc: DBAPIError) -> bool:
    return driver_code(exc) in (MYSQL_DEADLOCK, MYSQL_LOCK_WAIT_TIMEOUT)


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
        raise BackendUnavailable(
            f"database: {what} failed: {exc.orig!r}{tls_hint(exc)}") from exc
    except SQLAlchemyError as exc:
        raise BackendUnavailable(f"database: {what} failed: {exc}") from exc
