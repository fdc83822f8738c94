"""Several database hosts behind one engine (``LEAFPOOL_DATABASE_URL`` naming
``host1:port,host2:port,...``; docs/design.md §7.4): a Galera cluster, or any set of
MySQL/MariaDB servers of which the ones that take writes share the data.

A new connection goes to the host in use (the one that took the last connection) and,
when that host refuses it, to the next host of the list, in order, around to the first:
one process writes through one node at a time (concurrent writers on several Galera nodes
would abort each other at certification), and it stays on the node it moved to when the
first comes back. A host is passed over when it does not connect, when it is a Galera
node that is not ready (``wsrep_ready`` is not ``ON``: outside the primary component, or
joining) or when it is ``read_only`` (a replica). On a Galera node the session waits for
the cluster's writes before each read (``wsrep_sync_wait = 1``), so a read after a move
sees every allocation committed through the node left behind.

A statement is never sent twice: the host is chosen when a connection is made, and a
connection that dies fails its transaction (``BackendUnavailable`` to the caller). An
error saying that the node no longer takes writes (Galera's "not prepared for application
use", ``read_only``) counts as a lost connection: SQLAlchemy drops the pool's connections
and the next one looks for another host.

Built on SQLAlchemy's own hooks (``do_connect``, ``handle_error``) and PyMySQL: neither
PyMySQL nor SQLAlchemy's MySQL dialects take several hosts, and a connector that does
(MySQL Connector/Python's ``failover``) would be a second driver for the same work.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Dialect, ExceptionContext
from sqlalchemy.pool import ConnectionPoolEntry

from leafpool.core.setting_values import DatabaseHost

log = logging.getLogger(__name__)

DEFAULT_PORT = 3306
#: errors meaning "this node takes no writes now": ER_UNKNOWN_COM_ERROR (Galera: "WSREP has
#: not yet prepared node for application use"), ER_OPTION_PREVENTS_STATEMENT (read_only)
NOT_WRITABLE = (1047, 1290)


class HostList:
    """The hosts of one engine and the one in use."""

    def __init__(self, hosts: Sequence[DatabaseHost]) -> None:
        if not hosts:
            raise ValueError("no database host")
        self.hosts = tuple(hosts)
        self._index = 0
        self._lock = threading.Lock()

    def connect(self, dbapi: Any, cparams: dict[str, Any]) -> Any:
        """A DBAPI connection to the host in use or, failing it, to the next that connects
        and takes writes; when none does, the driver's ``OperationalError`` naming every
        host and why it was passed over."""
        start = self._index
        failures: list[str] = []
        for i in range(len(self.hosts)):
            index = (start + i) % len(self.hosts)
            host = self.hosts[index]
            try:
                conn = dbapi.connect(**{**cparams, "host": host.host,
                                        "port": host.port or DEFAULT_PORT})
            except dbapi.Error as exc:
                failures.append(f"{host}: {exc}")
                continue
            try:
                unfit = _unfit(conn)
            except dbapi.Error as exc:
                unfit = f"{exc}"
            if unfit is not None:
                with contextlib.suppress(dbapi.Error):
                    conn.close()
                failures.append(f"{host}: {unfit}")
                continue
            with self._lock:
                moved = index != self._index
                self._index = index
            if moved:
                log.warning("database: now using %s (%s)", host,
                            "; ".join(failures) or "the host in use changed")
            return conn
        raise dbapi.OperationalError(
            2003, "no database host took the connection: " + "; ".join(failures))


def _unfit(conn: Any) -> str | None:
    """Why this server must not take leafpool's writes (None: it may). Sets
    ``wsrep_sync_wait`` on a Galera node."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'wsrep_on')")
        variables = {str(name).lower(): str(value).upper() for name, value in cur.fetchall()}
        if variables.get("read_only") == "ON":
            return "read_only"
        if variables.get("wsrep_on") != "ON":
            return None
        cur.execute("SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
        ready = cur.fetchone()
        if ready is None or str(ready[1]).upper() != "ON":
            return "a Galera node that is not ready (wsrep_ready OFF: outside the " \
                   "primary component, or joining)"
        cur.execute("SET SESSION wsrep_sync_wait = 1")
    return None


def spread(engine: Engine, hosts: Sequence[DatabaseHost]) -> HostList:
    """Make ``engine`` connect through a :class:`HostList` of ``hosts``; returns it."""
    chosen = HostList(hosts)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Dialect, _record: ConnectionPoolEntry, _cargs: Any,
                 cparams: dict[str, Any]) -> Any:
        return chosen.connect(dialect.loaded_dbapi, cparams)

    @event.listens_for(engine, "handle_error")
    def _not_writable(context: ExceptionContext) -> None:
        code = getattr(context.original_exception, "args", (None,))[0]
        if code in NOT_WRITABLE:
            context.is_disconnect = True

    return chosen
