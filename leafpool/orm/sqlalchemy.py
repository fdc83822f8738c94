"""leafpool IDs as a SQLAlchemy 2 column default (docs/design.md §1.3)::

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True,
                                        default=leafpool_id("order"))

or in Core, ``Column("id", BigInteger, primary_key=True, default=leafpool_id("order"))``.

SQLAlchemy calls a column default once per row, even in an executemany; this default
takes the IDs of the whole statement at its first row, in one pop
(:meth:`leafpool.orm.batch.IdBatches.take`), and hands them to the rows in order: a
Core executemany costs one Redis round trip per statement. An ORM bulk INSERT
(``session.execute(insert(Model), rows)``) does without the per-row call: its pop
starts when the statement does (``do_orm_execute``), in a thread while the ORM copies
the rows, and its IDs are set in those copies as they are sent (``before_execute``).
For ``session.add_all(...)`` a ``before_flush`` listener (on
every :class:`~sqlalchemy.orm.Session`, registered when this module is imported) gives
the new objects their IDs before the flush, one pop per tag for all of them, in the
order they were added: ``obj.id`` is known after ``flush()``, and the flush inserts in
executemany batches on every database (MySQL has no RETURNING, so without known keys
the ORM would insert row by row). A single-row insert is one pop, unless
``LEAFPOOL_ORM_PREFETCH`` lets the process take IDs ahead.

With an async engine (``create_async_engine``, an async session) the default runs
inside SQLAlchemy's greenlet and awaits an :class:`~leafpool.client.AsyncClient` (one
per event loop) instead of blocking the loop.

``as_string=True`` hands IDs out as decimal strings (for JSON read by JavaScript, whose
numbers lose precision above 2**53); :class:`IdString` is the matching column type,
BIGINT in the database and ``str`` in Python.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy import BigInteger, Engine, event, inspect
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.interfaces import ExecutionContext
from sqlalchemy.exc import DontWrapMixin
from sqlalchemy.orm import Mapper, ORMExecuteState, Session, UOWTransaction
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeDecorator
from sqlalchemy.util import await_only

from leafpool.core.errors import LeafpoolError
from leafpool.core.tags import validate_tag
from leafpool.orm.batch import AsyncIdBatches, IdBatches, batches_source, default_batches
from leafpool.orm.ids import id_value

__all__ = ["IdDefault", "IdString", "leafpool_id"]

_async_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIdBatches] = (
    weakref.WeakKeyDictionary())


def _loop_batches() -> AsyncIdBatches:
    """The running loop's :class:`AsyncIdBatches` (an AsyncClient's connections belong
    to the loop they were opened on)."""
    loop = asyncio.get_running_loop()
    batches = _async_by_loop.get(loop)
    if batches is None:
        batches = _async_by_loop[loop] = AsyncIdBatches()
    return batches


class IdDefault:
    """A column default taking ``tag``'s IDs a statement at a time (see the module).

    ``batches``/``async_batches`` replace the process-wide sources (tests, or an
    application with its own :class:`~leafpool.client.Client` settings)."""

    def __init__(self, tag: str, *, as_string: bool = False,
                 batches: IdBatches | Callable[[], IdBatches] | None = None,
                 async_batches: Callable[[], AsyncIdBatches] | None = None) -> None:
        self.tag = validate_tag(tag)
        self.as_string = as_string
        self._batches = batches_source(batches, default_batches)
        self._async_batches = async_batches or _loop_batches
        # a statement's IDs not yet given to its rows, by execution context and column
        self._pending: weakref.WeakKeyDictionary[ExecutionContext, dict[object, deque[int]]] = (
            weakref.WeakKeyDictionary())
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"leafpool_id({self.tag!r}{', as_string=True' if self.as_string else ''})"

    def __call__(self, context: ExecutionContext | None) -> int | str:
        # the fast path, every row but a statement's first: the IDs of the statement and
        # column this thread is inserting (a thread's statements run one at a time; a
        # greenlet switches only inside the first row's pop)
        local = self._local
        try:
            if local.context is context and local.column is context.current_column:  # type: ignore[union-attr]
                ids = local.ids
                value = ids.popleft()
                if not ids:
                    local.context = None  # the statement's context is not kept alive
                return self.value(value)
        except (AttributeError, IndexError):
            pass
        try:
            value = self._next(context)
        except LeafpoolError as exc:  # PoolEmpty, UnknownTag, BackendUnavailable ...
            raise _unwrapped(exc) from exc.__cause__
        return self.value(value)

    def value(self, taken: int) -> int | str:
        """An ID as the column holds it in Python (a decimal string with ``as_string``)."""
        return str(taken) if self.as_string else taken

    def _next(self, context: ExecutionContext | None) -> int:
        """A statement's first row (or a column other than the last one's): its IDs by
        context and column, taken in one pop for all its rows."""
        if context is None:  # called by hand, outside a statement
            return self._take(None, 1)[0]
        column = getattr(context, "current_column", None)
        by_column = self._pending.setdefault(context, {})
        pending = by_column.get(column)
        if not pending:
            rows = len(getattr(context, "compiled_parameters", None) or ()) or 1
            pending = by_column[column] = deque(self._take(context, rows))
        value = pending.popleft()
        local = self._local
        local.context, local.column, local.ids = (context, column, pending) if pending else (
            None, None, None)
        return value

    def _take(self, context: ExecutionContext | None, n: int) -> list[int]:
        return self.take(n, context is not None and context.dialect.is_async)

    def take(self, n: int, is_async: bool = False) -> list[int]:
        """``n`` IDs in one pop; ``is_async``: inside SQLAlchemy's greenlet, through the
        running loop's AsyncClient."""
        if is_async:
            return await_only(self._async_batches().take(self.tag, n))  # type: ignore[no-any-return]
        return self._batches().take(self.tag, n)


_UNWRAPPED: dict[type[LeafpoolError], type[LeafpoolError]] = {}


def _unwrapped(exc: LeafpoolError) -> LeafpoolError:
    """``exc`` as an instance of a subclass of its own class that SQLAlchemy does not wrap
    in a ``StatementError`` (``DontWrapMixin``): ``except PoolEmpty`` works around a
    ``session.commit()`` as around ``client.next_id()``. It pickles as ``exc`` does."""
    cls = type(exc)
    sub = _UNWRAPPED.get(cls)
    if sub is None:
        def reduce(self: LeafpoolError) -> Any:
            plain = cls.__new__(cls)
            plain.args = self.args
            plain.__dict__.update(self.__dict__)
            return plain.__reduce__()

        sub = _UNWRAPPED.setdefault(cls, type(cls.__name__, (cls, DontWrapMixin), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__reduce__": reduce}))
    out = sub.__new__(sub)
    out.args = exc.args
    out.__dict__.update(exc.__dict__)
    return out.with_traceback(exc.__traceback__)


def leafpool_id(tag: str, *, as_string: bool = False,
                batches: IdBatches | Callable[[], IdBatches] | None = None,
                async_batches: Callable[[], AsyncIdBatches] | None = None) -> IdDefault:
    """A column default with ``tag``'s IDs: ``default=leafpool_id("order")``. An invalid
    tag is refused here, when the model is defined."""
    return IdDefault(tag, as_string=as_string, batches=batches, async_batches=async_batches)


_ID_ATTRIBUTES: weakref.WeakKeyDictionary[Mapper[Any], list[tuple[str, IdDefault]]] = (
    weakref.WeakKeyDictionary())


def _id_attributes(mapper: Mapper[Any]) -> list[tuple[str, IdDefault]]:
    """The mapped attributes of ``mapper`` whose column default is a leafpool_id."""
    found = _ID_ATTRIBUTES.get(mapper)
    if found is None:
        found = _ID_ATTRIBUTES[mapper] = [
            (attr.key, column.default.arg) for attr in mapper.column_attrs
            for column in attr.columns
            if isinstance(getattr(column.default, "arg", None), IdDefault)]
    return found


@event.listens_for(Session, "before_flush")
def _ids_before_flush(session: Session, flush_context: UOWTransaction,
                      instances: object) -> None:
    """Give the new objects of a flush their IDs before it, one pop per tag and column
    for all of them, in the order they were added: the flush then knows every primary
    key, and inserts in executemany batches on every database (MySQL has no RETURNING,
    so it would otherwise insert row by row), and ``obj.id`` is set as with Django."""
    wanting: dict[tuple[str, IdDefault], tuple[Mapper[Any], list[object]]] = {}
    for obj in session.new:
        mapper = inspect(obj).mapper
        for key, default in _id_attributes(mapper):
            if getattr(obj, key) is None:
                wanting.setdefault((key, default), (mapper, []))[1].append(obj)
    for (key, default), (mapper, objs) in wanting.items():
        is_async = session.get_bind(mapper).dialect.is_async
        try:
            ids = default.take(len(objs), is_async)
        except LeafpoolError as exc:
            raise _unwrapped(exc) from exc.__cause__
        for obj, value in zip(objs, ids, strict=True):
            setattr(obj, key, default.value(value))


# -- ORM bulk INSERT: the IDs set in the rows, the pop under way while the ORM builds them --

BULK_OPTION = "leafpool_bulk_ids"  # marks an ORM bulk INSERT: its IDs, by column key

_bulk_pool: ThreadPoolExecutor | None = None
_bulk_pool_guard = threading.Lock()


def _forget_pool_in_child() -> None:
    """A forked child has none of its parent's threads: it starts its own pool."""
    global _bulk_pool, _bulk_pool_guard
    _bulk_pool, _bulk_pool_guard = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def _popper() -> ThreadPoolExecutor:
    """The threads that run a bulk INSERT's pop while the ORM builds its rows."""
    global _bulk_pool
    with _bulk_pool_guard:
        if _bulk_pool is None:
            _bulk_pool = ThreadPoolExecutor(max_workers=4,
                                            thread_name_prefix="leafpool-orm-pop")
        return _bulk_pool


class _BulkIds:
    """One ORM bulk INSERT's IDs for one column: a pop started when the statement began,
    handed to its rows (in one or more executes, in row order) as the ORM sends them."""

    def __init__(self, default: IdDefault, rows: int, is_async: bool) -> None:
        self.default = default
        self._ids: deque[int] | None = None
        # the async engine's pop must run on its own loop, in the statement's greenlet
        self._future: Future[list[int]] | None = None if is_async else (
            _popper().submit(default.take, rows))
        self._is_async = is_async

    def take(self, n: int) -> list[int]:
        """The next ``n`` IDs: the started pop's (waited for once), or a pop of their own
        if the started one came short (rows the ORM added that were not in the call)."""
        if self._ids is None:
            self._ids = deque(self._future.result() if self._future is not None else ())
        if len(self._ids) < n:
            return self.default.take(n, self._is_async) if not self._ids else (
                [self._ids.popleft() for _ in range(len(self._ids))]
                + self.default.take(n - len(self._ids), self._is_async))
        return [self._ids.popleft() for _ in range(n)]


_BULK_COLUMNS: weakref.WeakKeyDictionary[Mapper[Any], list[tuple[str, str, IdDefault]]] = (
    weakref.WeakKeyDictionary())


def _bulk_columns(mapper: Mapper[Any]) -> list[tuple[str, str, IdDefault]]:
    """(attribute key, column key, default) of the mapped columns of ``mapper``'s table
    whose default is a leafpool_id."""
    found = _BULK_COLUMNS.get(mapper)
    if found is None:
        found = _BULK_COLUMNS[mapper] = [
            (attr.key, column.key, column.default.arg) for attr in mapper.column_attrs
            for column in attr.columns
            if column.table is mapper.local_table
            and isinstance(getattr(column.default, "arg", None), IdDefault)]
    return found


@event.listens_for(Session, "do_orm_execute")
def _start_bulk_pops(state: ORMExecuteState) -> None:
    """``session.execute(insert(Model), rows)`` of a model with leafpool_id columns: the
    pop of each column's IDs starts now, one for all the rows that lack it, in a thread
    while the ORM builds its own copies of the rows; :func:`_ids_in_bulk_rows` sets the
    IDs in those copies (never in the caller's dicts) as the statement is sent."""
    rows = state.parameters
    if not state.is_insert or not isinstance(rows, list) or not rows:
        return
    mapper = state.bind_mapper
    # a model over several tables (joined inheritance) keeps the column default
    if mapper is None or len(mapper.tables) != 1 or not _bulk_columns(mapper):
        return
    is_async = state.session.get_bind(mapper).dialect.is_async
    started: dict[str, _BulkIds] = {}
    for attr, column, default in _bulk_columns(mapper):
        n = sum(1 for row in rows if row.get(attr) is None)
        if n:
            started[column] = _BulkIds(default, n, is_async)
    if started:
        state.update_execution_options(**{BULK_OPTION: started})


@event.listens_for(Engine, "before_execute", retval=True)
def _ids_in_bulk_rows(conn: Any, clauseelement: Any, multiparams: Any, params: Any,
                      execution_options: Any) -> tuple[Any, Any, Any]:
    """An ORM bulk INSERT's rows (dicts the ORM built, one per row) get their IDs here:
    the started pop's, ascending in row order. SQLAlchemy then sends the key as a value
    given and calls no column default per row (a Python call per row and column in its
    executemany loop). Every other statement is left to the column default."""
    started = execution_options.get(BULK_OPTION)
    if started and isinstance(clauseelement, Insert) and isinstance(multiparams, list):
        for key, ids in started.items():
            # the ORM sends rows of one set of keys per execute: lacking in the first, in all
            rows = multiparams if multiparams and key not in multiparams[0] else [
                row for row in multiparams if row.get(key) is None]
            if not rows:
                continue
            try:
                taken = ids.take(len(rows))
            except LeafpoolError as exc:
                raise _unwrapped(exc) from exc.__cause__
            if ids.default.as_string:
                taken = [str(one) for one in taken]
            for row, one in zip(rows, taken, strict=True):
                row[key] = one
    return clauseelement, multiparams, params


class IdString(TypeDecorator[str]):
    """An ID column that is BIGINT in the database and a decimal string in Python, for
    IDs that JavaScript reads (``default=leafpool_id("order", as_string=True)``)."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else id_value("id", value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else str(value)
