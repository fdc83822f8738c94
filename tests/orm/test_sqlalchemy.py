"""The SQLAlchemy column default (leafpool/orm/sqlalchemy.py) against a real Redis and
real SQLite and MariaDB databases, sync and async: every way of inserting many rows
costs one pop per statement, IDs are the pool's in row order, and an empty pool or an
unknown tag inserts nothing."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings
from leafpool.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvalidTag,
    PoolEmpty,
    UnknownTag,
)
from leafpool.orm.batch import AsyncIdBatches, IdBatches
from leafpool.orm.sqlalchemy import IdDefault, IdString, leafpool_id
from tests.orm.test_batch import lpops
from tests.support.http_helpers import fill
from tests.support.servers import free_port

SNOWFLAKE_IDS = [(1_700_000_000_000 << 22) + i for i in range(1, 2001)]  # above 2**53


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(empty_policy="raise")


@pytest.fixture
def source(settings: Settings) -> IdBatches:
    return IdBatches(lambda: Client(settings=settings), prefetch=0)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def models(source: IdBatches) -> tuple[type[DeclarativeBase], type, type]:
    """A fresh declarative base with an order model (segment tag) and a message model
    whose IDs are strings (snowflake tag)."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True,
                                        default=leafpool_id("order", batches=source))
        note: Mapped[str] = mapped_column(String(40))

    class Message(Base):
        __tablename__ = "messages"
        id: Mapped[str] = mapped_column(IdString, primary_key=True,
                                        default=leafpool_id("msg", as_string=True,
                                                            batches=source))
        body: Mapped[str] = mapped_column(String(40))

    return Base, Order, Message


def test_add_all_is_one_pop_and_rows_get_the_pools_ids_in_order(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "order", list(range(1, 1001)))
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        before = lpops(r)
        orders = [Order(note=f"n{i}") for i in range(500)]
        session.add_all(orders)
        session.commit()
        assert lpops(r) - before == 1
        assert [o.id for o in orders] == list(range(1, 501))
        stored = session.execute(select(Order.id, Order.note).order_by(Order.id)).all()
    assert stored == [(i + 1, f"n{i}") for i in range(500)]


def test_orm_bulk_insert_core_executemany_and_single_rows(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "order", list(range(1, 3001)))
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    table = Order.__table__
    with Session(engine) as session:
        before = lpops(r)
        session.execute(insert(Order), [{"note": f"b{i}"} for i in range(1000)])
        session.commit()
        assert lpops(r) - before == 1
    with engine.begin() as conn:
        before = lpops(r)
        conn.execute(table.insert(), [{"note": f"c{i}"} for i in range(700)])
        assert lpops(r) - before == 1
        before = lpops(r)
        for i in range(3):
            conn.execute(table.insert().values(note=f"s{i}"))
        assert lpops(r) - before == 3
        conn.execute(table.insert().values(id=10**12, note="mine"))  # given: no pop
        assert lpops(r) - before == 3
        ids = conn.execute(select(table.c.id).order_by(table.c.id)).scalars().all()
    assert ids == [*range(1, 1704), 10**12]


def test_string_ids_above_two_to_the_53_round_trip_exactly(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "msg", SNOWFLAKE_IDS, mode="snowflake")
    Base, _, Message = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        messages = [Message(body=f"m{i}") for i in range(3)]
        session.add_all(messages)
        session.commit()
        assert [m.id for m in messages] == [str(i) for i in SNOWFLAKE_IDS[:3]]
        session.expire_all()
        assert session.scalars(select(Message.id).order_by(Message.id)).all() == [
            str(i) for i in SNOWFLAKE_IDS[:3]]
        assert session.get(Message, str(SNOWFLAKE_IDS[1])) is not None
        with engine.connect() as conn:  # a number in the database
            raw = conn.execute(text("SELECT MIN(id) FROM messages")).scalar_one()
        assert raw == SNOWFLAKE_IDS[0] and SNOWFLAKE_IDS[0] > 2**53


@pytest.mark.parametrize("bad", ["-1", "01", "1e3", "12a", " 5", str(2**63), 1.5])
def test_a_bad_string_id_is_refused_naming_the_value(
        r: redis.Redis, engine: Engine, source: IdBatches, bad: object) -> None:
    Base, _, Message = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session, pytest.raises(Exception) as caught:
        session.add(Message(id=bad, body="x"))
        session.commit()
    cause = caught.value if isinstance(caught.value, InvalidArgument) else (
        caught.value.__cause__ or caught.value.__context__)
    assert isinstance(cause, InvalidArgument) and repr(bad) in str(cause)


def test_an_empty_pool_inserts_nothing_and_never_a_sentinel(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "order", [1, 2])
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Order(note="x") for _ in range(5)])
        with pytest.raises(PoolEmpty) as caught:  # not wrapped in a StatementError
            session.commit()
        session.rollback()
        again = pickle.loads(pickle.dumps(caught.value))
        assert type(again) is PoolEmpty and again.tag == "order"
        assert session.scalar(select(Order.id)) is None
    with engine.begin() as conn, pytest.raises(UnknownTag):
        conn.execute(Table("orders", MetaData(), Column("id", BigInteger, primary_key=True,
                                                        default=leafpool_id("ghost",
                                                                            batches=source)),
                           Column("note", String(40))).insert().values(note="x"))


def test_redis_not_answering_reaches_the_caller_as_itself_and_inserts_nothing(
        engine: Engine, make_settings: Callable[..., Settings]) -> None:
    down = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    Base, Order, _ = models(IdBatches(lambda: Client(settings=down), prefetch=0))
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Order(note="x")])
        with pytest.raises(BackendUnavailable) as caught:  # not wrapped in a StatementError
            session.commit()
        session.rollback()
        assert isinstance(caught.value, BackendUnavailable)
        assert session.scalar(select(Order.id)) is None
    with engine.begin() as conn, pytest.raises(BackendUnavailable):
        conn.execute(insert(Order.__table__), [{"note": "y"}, {"note": "z"}])
    with Session(engine) as session:
        assert session.scalar(select(Order.id)) is None


def test_a_bad_tag_is_refused_when_the_model_is_defined() -> None:
    with pytest.raises(InvalidTag):
        leafpool_id("bad tag")


def test_the_column_is_not_auto_increment_in_mariadb(mysql_url: str, source: IdBatches
                                                     ) -> None:
    engine = create_engine(mysql_url)
    try:
        Base, _, _ = models(source)
        Base.metadata.create_all(engine)
        with engine.connect() as conn:
            ddl = conn.execute(text("SHOW CREATE TABLE orders")).one()[1]
        assert "AUTO_INCREMENT" not in ddl.upper() and "bigint" in ddl.lower()
    finally:
        engine.dispose()


def test_two_id_columns_of_one_table_each_take_one_pop(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "order", list(range(1, 101)))
    fill(r, "msg", list(range(1001, 1101)))
    table = Table("pairs", MetaData(),
                  Column("id", BigInteger, primary_key=True,
                         default=leafpool_id("order", batches=source)),
                  Column("ref", BigInteger, default=leafpool_id("msg", batches=source)),
                  Column("n", Integer))
    table.metadata.create_all(engine)
    with engine.begin() as conn:
        before = lpops(r)
        conn.execute(table.insert(), [{"n": i} for i in range(10)])
        assert lpops(r) - before == 2
        rows = conn.execute(select(table.c.id, table.c.ref).order_by(table.c.id)).all()
    assert rows == [(i, 1000 + i) for i in range(1, 11)]


def _async_url(url: str) -> str:
    return url.replace("sqlite:", "sqlite+aiosqlite:").replace("+pymysql", "+aiomysql")


def test_an_async_session_awaits_the_async_client_one_pop_per_flush(
        r: redis.Redis, database_url: str, settings: Settings) -> None:
    fill(r, "order", list(range(1, 2001)))

    def no_sync_client() -> IdBatches:
        raise AssertionError("an async session took IDs with the blocking client")

    sources: list[AsyncIdBatches] = []

    def loop_source() -> AsyncIdBatches:
        if not sources:
            sources.append(AsyncIdBatches(lambda: AsyncClient(settings=settings)))
        return sources[0]

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True, default=leafpool_id(
            "order", batches=no_sync_client, async_batches=loop_source))
        note: Mapped[str] = mapped_column(String(40))

    async def run() -> tuple[list[int], int, list[int]]:
        engine = create_async_engine(_async_url(database_url))
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            async with AsyncSession(engine, expire_on_commit=False) as session:
                before = lpops(r)
                orders = [Order(note=str(i)) for i in range(300)]
                session.add_all(orders)
                await session.commit()
                await session.execute(insert(Order), [{"note": "b"} for _ in range(200)])
                await session.commit()
                pops = lpops(r) - before
                stored = (await session.scalars(select(Order.id).order_by(Order.id))).all()
            return [o.id for o in orders], pops, list(stored)
        finally:
            await engine.dispose()
            if sources:
                await sources[0].aclose()

    ids, pops, stored = asyncio.run(run())
    assert ids == list(range(1, 301)) and pops == 2
    assert stored == list(range(1, 501))


def test_a_flush_without_returning_still_inserts_in_one_batch_with_ids_known_before(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    """A table without RETURNING (as every table on MySQL): the ORM would insert row by
    row to learn each key; the IDs given before the flush let it executemany."""
    fill(r, "order", list(range(1, 1001)))

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        __table_args__ = {"implicit_returning": False}
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True,
                                        default=leafpool_id("order", batches=source))
        note: Mapped[str] = mapped_column(String(40))

    Base.metadata.create_all(engine)
    inserts: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, sql, *rest: inserts.append(sql)
                 if sql.startswith("INSERT") else None)
    with Session(engine) as session:
        before = lpops(r)
        orders = [Order(note=str(i)) for i in range(400)]
        session.add_all(orders)
        session.flush()
        assert [o.id for o in orders] == list(range(1, 401))
        session.commit()
    assert lpops(r) - before == 1
    assert len(inserts) == 1  # one executemany, not 400 statements


# -- ORM bulk INSERT: the IDs set in the ORM's rows, no column default call per row -------

def _default_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the column default's calls (SQLAlchemy's per-row path)."""
    calls: list[int] = []
    call = IdDefault.__call__

    def counted(self: IdDefault, context: object) -> int | str:
        calls.append(1)
        return call(self, context)  # type: ignore[arg-type]

    monkeypatch.setattr(IdDefault, "__call__", counted)
    return calls


def test_an_orm_bulk_insert_is_one_pop_with_no_default_call_per_row(
        r: redis.Redis, engine: Engine, source: IdBatches,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fill(r, "order", list(range(1, 3001)))
    fill(r, "msg", SNOWFLAKE_IDS)
    Base, Order, Message = models(source)
    Base.metadata.create_all(engine)
    calls = _default_calls(monkeypatch)
    rows = [{"note": f"b{i:04d}"} for i in range(1000)]
    with Session(engine) as session:
        before = lpops(r)
        session.execute(insert(Order), rows)
        session.execute(insert(Message), [{"body": f"m{i}"} for i in range(3)])
        session.commit()
        assert lpops(r) - before == 2 and calls == []
        ids = session.scalars(select(Order.id).order_by(Order.note)).all()
        assert session.scalars(select(Message.id).order_by(Message.body)).all() == [
            str(i) for i in SNOWFLAKE_IDS[:3]]
    assert ids == sorted(ids) and sorted(ids) == list(range(1, 1001))  # in row order
    assert all(row.keys() == {"note"} for row in rows)  # the caller's dicts: untouched
    with engine.begin() as conn:  # Core executemany: still the column default's, one pop
        before = lpops(r)
        conn.execute(Order.__table__.insert(), [{"note": f"c{i}"} for i in range(10)])
        assert lpops(r) - before == 1 and len(calls) == 10


def test_the_same_rows_inserted_twice_get_new_ids(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    """The IDs go into the ORM's copies of the rows: a caller who inserts the same list
    again (a retry, a second table) gets fresh IDs, never the first statement's."""
    fill(r, "order", list(range(1, 101)))
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    rows = [{"note": f"n{i}"} for i in range(20)]
    with Session(engine) as session:
        session.execute(insert(Order), rows)
        session.execute(insert(Order), rows)
        session.commit()
        assert session.scalars(select(Order.id).order_by(Order.id)).all() == list(
            range(1, 41))


def test_a_bulk_insert_takes_its_ids_as_it_runs_above_every_earlier_pop(
        r: redis.Redis, engine: Engine, source: IdBatches, settings: Settings) -> None:
    """Cross-process order (G2): another client's pop between two statements lies between
    their IDs; a batch's IDs ascend in row order; rows given a key keep it."""
    fill(r, "order", list(range(1, 2001)))
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    other = Client(settings=settings)
    try:
        with Session(engine) as session:
            session.execute(insert(Order), [{"note": f"a{i:03d}"} for i in range(100)])
            session.commit()
            between = other.next_id("order")
            session.execute(insert(Order), [
                {"note": f"b{i:03d}", **({"id": 10**12 + i} if i % 10 == 0 else {})}
                for i in range(100)])
            session.commit()
            after = other.next_id("order")
            first = session.scalars(select(Order.id).where(Order.note.like("a%"))
                                    .order_by(Order.note)).all()
            second = session.execute(select(Order.note, Order.id).where(
                Order.note.like("b%")).order_by(Order.note)).all()
    finally:
        other.close()
    pooled = [i for note, i in second if int(note[1:]) % 10]
    given = [i for note, i in second if int(note[1:]) % 10 == 0]
    assert first == sorted(first) and max(first) < between
    assert pooled == sorted(pooled) and between < min(pooled) and max(pooled) < after
    assert given == [10**12 + i for i in range(0, 100, 10)]


def test_an_empty_pool_fails_a_bulk_insert_as_itself_and_inserts_nothing(
        r: redis.Redis, engine: Engine, source: IdBatches) -> None:
    fill(r, "order", [1, 2, 3])
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        with pytest.raises(PoolEmpty):  # not wrapped in a StatementError
            session.execute(insert(Order), [{"note": "x"} for _ in range(5)])
        session.rollback()
        assert session.scalar(select(Order.id)) is None


def test_a_forked_child_runs_its_own_bulk_pops(
        r: redis.Redis, engine: Engine, source: IdBatches, tmp_path: Path) -> None:
    """The threads that run a bulk INSERT's pop do not survive a fork: the child starts
    its own (else its first bulk insert would wait on a thread that is not there)."""
    fill(r, "order", list(range(1, 101)))
    Base, Order, _ = models(source)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.execute(insert(Order), [{"note": "parent"} for _ in range(10)])
        session.commit()
    engine.dispose()  # the child opens its own database connections
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            with Session(engine) as session:
                session.execute(insert(Order), [{"note": "child"} for _ in range(10)])
                session.commit()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # bounded polling for the child's exit
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's bulk insert did not finish in 60 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    with Session(engine) as session:
        child = session.scalars(select(Order.id).where(Order.note == "child")
                                .order_by(Order.id)).all()
    assert child == list(range(11, 21))
