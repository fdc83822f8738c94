"""Reading a tag's guard (docs/design.md §7.3): what the application stored, for the
allocation's floor (:func:`reading`) and for an operator setting one (:func:`checked`).
The guard itself (its table, its query) is :mod:`leafpool.database.guard`'s."""

from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from leafpool.core.errors import BackendUnavailable, GuardFailed, InvalidArgument
from leafpool.database.guard import Guard, read_guard, stored_max
from leafpool.segment.counter import Stored

log = logging.getLogger(__name__)


def _stored_max(engine: Engine, guard: Guard) -> int | None:
    with engine.connect() as conn:
        return stored_max(conn, guard)


def _reason(exc: Exception) -> str:
    return str(exc.orig if isinstance(exc, DBAPIError) else exc)


def reading(conn: Connection, tag: str) -> Stored | None:
    """What the tag's guard reads now (None: the tag has no guard), on ``conn``: the
    guard and its column in one transaction (an allocation's, which holds the row's
    lock). A guard that cannot be read refuses (:class:`GuardFailed`): it is never
    skipped."""
    guard = read_guard(conn, tag)
    if guard is None:
        return None
    try:
        return Stored(str(guard), stored_max(conn, guard))
    except (SQLAlchemyError, ValueError) as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise BackendUnavailable(f"database: {tag}: read the guard {guard} failed: "
                                     f"{exc.orig!r}") from exc
        log.error("%s: the guard %s cannot be read: %s", tag, guard, _reason(exc))
        raise GuardFailed(tag, str(guard), _reason(exc)) from exc


def checked(engine: Engine, text: str) -> tuple[Guard, int | None]:
    """A guard an operator gives, parsed and read once: the guard and what it reads."""
    guard = Guard.parse(text)
    try:
        return guard, _stored_max(engine, guard)
    except (SQLAlchemyError, ValueError) as exc:
        raise InvalidArgument("guard", text, f"a table and column of integers this database "
                              f"user may read ({_reason(exc)})") from exc
