"""A tag's guard (docs/design.md §7.3): the application's column holding the IDs it
stored, read when the pool has no mark for the tag and before a heal. The double failure
(Redis wiped and the row moved back below IDs handed out) against real MariaDB and Redis,
with and without a guard; the guard's form and its refusals on both stores."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.core.errors import (
    ConfigurationError,
    CounterBehind,
    GuardFailed,
    InvalidArgument,
    UnknownTag,
)
from leafpool.database.guard import Guard
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.clocks import FakeWallClock


def _orders(store: SegmentStore, ids: list[int] = []) -> None:  # noqa: B006 (read only)
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS orders "
                          "(id BIGINT PRIMARY KEY, note VARCHAR(32))"))
        for order_id in ids:  # as the application stores what it took
            conn.execute(text("INSERT INTO orders (id, note) VALUES (:i, 'paid')"),
                         {"i": order_id})


def _set_max_id(store: SegmentStore, tag: str, max_id: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = :t"),
                      {"m": max_id, "t": tag})


# -- the double failure, against MariaDB ------------------------------------------------------

def _double_failure(mysql_url: str, pool: Pool, r: redis.Redis,
                    make_settings: Callable[..., Settings], guard: str | None
                    ) -> tuple[set[int], list[int], SegmentStore]:
    """The application takes IDs and stores them in ``orders``; then Redis loses
    everything (flushed) and the row goes back to 1 (a restore of an old backup, a
    replica that missed every advance). Returns the stored IDs, those handed out after,
    and the store."""
    store = SegmentStore.from_url(mysql_url)
    store.init_schema()
    _orders(store)
    store.add_tag("order", step=1000, guard=guard)
    clock = FakeWallClock()
    settings = make_settings(pool_floor=1000, pool_ceiling=10_000, reserve_seconds=1)
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    stored: list[int] = []
    for _ in range(3):
        refiller.refill("order", force=True)
        taken = [int(x) for x in r.lpop("leafpool:{order}:ids", 700) or []]
        _orders(store, taken)
        stored += taken
        clock.advance(1.0)
    r.flushall()  # Redis wiped: no mark, no reserve, no state
    _set_max_id(store, "order", 1)
    after: list[int] = []
    for _ in range(3):
        refiller.refill("order", force=True)
        after += [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000) or []]
        clock.advance(1.0)
    return set(stored), after, store


def test_with_a_guard_no_stored_id_is_handed_out_again_after_redis_and_the_row_are_lost(
    mysql_url: str, pool: Pool, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    stored, after, store = _double_failure(mysql_url, pool, r, make_settings, "orders.id")
    assert len(stored) == 2100 and after
    assert not stored & set(after), "IDs the application stored were handed out again"
    assert min(after) == max(stored) + 1  # the guard's reading, healed up to
    assert after == sorted(set(after))
    state = pool.snapshot("order").state
    assert state["heals"] == "1" and state["last_heal"] == f"max_id 1 -> {max(stored) + 1}"
    assert store.get_tag("order").max_id == int(state["max_id"])


def test_without_a_guard_the_same_double_failure_repeats_ids(
    mysql_url: str, pool: Pool, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """What the guard protects against: nothing in Redis or the table can know better."""
    stored, after, _ = _double_failure(mysql_url, pool, r, make_settings, None)
    assert len(stored & set(after)) > 1000
    assert "heals" not in pool.snapshot("order").state


def test_a_guard_may_name_another_schema(mysql_url: str) -> None:
    store = SegmentStore.from_url(mysql_url)
    store.init_schema()
    app_db = mysql_url.rsplit("/", 1)[1] + "_app"
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE DATABASE {app_db}"))
        conn.execute(text(f"CREATE TABLE {app_db}.orders (id BIGINT PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {app_db}.orders VALUES (41), (977)"))
    try:
        store.add_tag("order", step=10, guard=f"{app_db}.orders.id")
        assert store.get_tag("order").max_id == 978
        stored = store.guard("order")
        assert stored is not None and (stored.guard, stored.max_id) == \
            (f"{app_db}.orders.id", 977)
    finally:
        with store.engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE {app_db}"))


# -- the guard's form and refusals, on both stores ---------------------------------------------

def test_a_guard_is_names_never_sql() -> None:
    assert Guard.parse("orders.id") == Guard("orders", "id")
    assert Guard.parse("shop.orders.id") == Guard("orders", "id", "shop")
    for bad in ["orders", "a.b.c.d", "orders.id; DROP TABLE leaf_alloc", "orders.`id`",
                "1orders.id", "orders.i d", "SELECT MAX(id) FROM orders", "o" * 65 + ".id"]:
        with pytest.raises(InvalidArgument, match="guard="):
            Guard.parse(bad)
    query = str(Guard.parse("Order.Select").query())
    assert '"Order"' in query and '"Select"' in query  # quoted even when not needed


def test_a_new_tag_starts_above_its_guard_and_set_and_clear_check_it(
    store: SegmentStore,
) -> None:
    _orders(store, [7, 120])
    assert store.add_tag("order", step=10, guard="orders.id").max_id == 121
    with pytest.raises(InvalidArgument, match=r"start=50 .*at least 121: the application "
                                              r"stored IDs up to 120, guard orders.id"):
        store.add_tag("other", step=10, start=50, guard="orders.id")
    stored = store.guard("order")
    assert stored is not None and (stored.guard, stored.max_id) == ("orders.id", 120)
    with pytest.raises(InvalidArgument, match=r"guard='nothing\.id'.*may read"):
        store.set_guard("order", "nothing.id")  # refused, and the guard is kept
    assert store.guard("order") == stored
    _orders(store, [121])
    with pytest.raises(InvalidArgument, match=r"guard='orders\.note'.*'paid', not an integer"):
        store.set_guard("order", "orders.note")
    with store.engine.begin() as conn:  # digits in a text column: MAX compares text
        conn.execute(text("CREATE TABLE codes (code VARCHAR(20))"))
        conn.execute(text("INSERT INTO codes VALUES ('99'), ('100')"))
    with pytest.raises(InvalidArgument, match=r"guard='codes.code'.*'99', not an integer"):
        store.set_guard("order", "codes.code")
    with pytest.raises(UnknownTag):
        store.set_guard("nope", "orders.id")
    assert store.set_guard("order", None) is None
    assert store.guard("order") is None
    assert store.set_guard("order", "orders.id") == 121
    store.remove_tag("order")  # the guard goes with the tag
    assert store.guard("order") is None


def test_the_guard_raises_the_floor_when_the_pool_has_no_mark(store: SegmentStore) -> None:
    """``floor`` 0 (a new or wiped Redis): the guard is read. Under refuse the counter
    below it is refused, naming the guard; under heal it is moved above it."""
    _orders(store)
    store.add_tag("order", step=10, guard="orders.id")
    _orders(store, [500])  # stored after the add (the IDs came from elsewhere)
    with pytest.raises(CounterBehind, match=r"max_id=1 is below 501,.*guard orders.id"):
        store.allocate("order", floor=0, heal=False)
    seg = store.allocate("order", floor=0, heal=True)
    assert (seg.start, seg.healed_from) == (501, 1)


def test_a_guard_that_cannot_be_read_refuses_the_allocation_it_would_protect(
    store: SegmentStore, pool: Pool, make_settings: Callable[..., Settings]
) -> None:
    """Not skipped: a guard on a table gone (or not granted) refuses, naming the tag and
    the guard, and nothing is allocated. With the pool's mark and the counter above it,
    the guard is not needed and not read."""
    _orders(store, [30])
    store.add_tag("order", step=10, guard="orders.id")
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE orders"))
    with pytest.raises(GuardFailed, match=r"^order: the guard orders.id could not be read"):
        store.allocate("order", floor=0, heal=True)
    assert store.get_tag("order").max_id == 31
    assert store.allocate("order", floor=31, heal=True).start == 31  # not needed: not read
    with pytest.raises(GuardFailed, match=r"^order: the guard orders\.id"):
        store.allocate("order", floor=100, heal=True)  # needed before a heal
    refiller = SegmentRefiller(pool, store, make_settings())
    with pytest.raises(GuardFailed):
        refiller.refill("order")  # Redis holds no mark for it yet
    assert "the guard orders.id could not be read" in pool.snapshot("order").state["last_error"]


def test_a_database_from_before_guards_allocates_without_another_db_init(
    store: SegmentStore, database_url: str
) -> None:
    """An upgrade needs no step: on a database where ``leafpool db init`` has not run since
    guards came (no ``leafpool_tag_guard``), nobody can have set a guard, so a new tag or a
    wiped Redis (floor 0) allocates as unguarded; setting a guard still asks for db init."""
    store.add_tag("order", step=10)
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE leafpool_tag_guard"))
    upgraded = SegmentStore.from_url(database_url)  # a worker started after the upgrade
    try:
        assert upgraded.allocate("order", floor=0, heal=True).start == 1
        with pytest.raises(ConfigurationError, match="leafpool db init"):
            upgraded.set_guard("order", None)
    finally:
        upgraded.engine.dispose()
