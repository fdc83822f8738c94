"""Tag sync (leaf_alloc -> pools)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.core.errors import CounterBehind, TagExists
from leafpool.housekeeping.sync import FULL_SYNC_SECONDS, SyncMemo, SyncResult, sync_tags
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore, TagRow


def test_a_tag_inserted_by_sql_is_registered(pool: Pool, store: SegmentStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 500)"))
    result = sync_tags(pool, store)
    assert result.added == ["pay"] and result.total == 1
    assert pool.is_known("pay")
    assert pool.snapshot("pay").state["table_step"] == "500"
    assert sync_tags(pool, store).added == []


def test_a_tag_deleted_from_the_table_loses_its_keys(
    pool: Pool, store: SegmentStore, r: redis.Redis
) -> None:
    store.add_tag("pay", step=10)
    store.add_tag("keep", step=10)
    sync_tags(pool, store)
    r.rpush("leafpool:{pay}:ids", 1, 2, 3)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'pay'"))
    assert sync_tags(pool, store).removed == ["pay"]
    assert r.keys("leafpool:{pay}:*") == []
    assert pool.tags() == ["keep"]


def test_snowflake_tags_come_and_go_with_their_table(pool: Pool, store: SegmentStore) -> None:
    store.add_snowflake_tag("flake")
    assert sync_tags(pool, store).added == ["flake"]
    assert pool.mode("flake") == "snowflake"
    assert sync_tags(pool, store).removed == []
    store.remove_snowflake_tag("flake")
    assert sync_tags(pool, store).removed == ["flake"]
    assert not pool.is_known("flake")


def test_one_name_is_one_tag_across_modes(store: SegmentStore) -> None:
    store.add_tag("order", step=10)
    with pytest.raises(TagExists):
        store.add_snowflake_tag("order")
    store.add_snowflake_tag("flake")
    with pytest.raises(TagExists):
        store.add_tag("flake", step=10)


def test_a_step_changed_in_the_table_reaches_the_pool(pool: Pool, store: SegmentStore) -> None:
    store.add_tag("pay", step=10)
    sync_tags(pool, store)
    store.set_step("pay", 70)
    sync_tags(pool, store)
    assert pool.snapshot("pay").state["table_step"] == "70"


def test_a_tag_added_between_the_syncs_reads_is_not_dropped(
    pool: Pool, store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_list = store.list_tags

    def list_then_add() -> list[TagRow]:
        rows = real_list()
        if not pool.is_known("late"):  # `leafpool tag add late`: database, then Redis
            store.add_tag("late", step=10)
            pool.register("late", "segment", 1, table_step=10)
        return rows

    monkeypatch.setattr(store, "list_tags", list_then_add)
    assert sync_tags(pool, store).removed == []
    assert pool.is_known("late")


def test_a_tag_removed_and_added_again_during_the_sync_is_kept(
    pool: Pool, store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add_tag("pay", step=10)
    pool.register("pay", "segment", 1, table_step=10)
    real_list = store.list_tags

    def remove_list_add() -> list[TagRow]:
        store.remove_tag("pay")  # `leafpool tag remove pay` ...
        pool.drop("pay")
        rows = real_list()  # ... seen by the sync's database read ...
        store.add_tag("pay", step=10)  # ... then `leafpool tag add pay` at once
        pool.register("pay", "segment", 2, table_step=10)
        return rows

    monkeypatch.setattr(store, "list_tags", remove_list_add)
    assert sync_tags(pool, store).removed == []
    assert pool.is_known("pay") and pool.snapshot("pay").state["created_ms"] == "2"


def test_a_row_deleted_by_hand_keeps_its_mark_for_a_row_inserted_again(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """Deleted with SQL, the sync drops the keys; inserted again with a lower max_id, the
    tag refuses to repeat IDs until the counter is moved above what it handed out
    (LEAFPOOL_COUNTER_BEHIND=refuse; the default heals it: tests/segment/test_heal.py)."""
    refiller = SegmentRefiller(pool, store, make_settings(pool_floor=20, pool_ceiling=20,
                                                          counter_behind="refuse"))
    store.add_tag("pay", step=10)
    sync_tags(pool, store)
    refiller.refill("pay")
    handed_out = [int(x) for x in r.lpop("leafpool:{pay}:ids", 3)]  # type: ignore[union-attr]
    assert handed_out == [1, 2, 3]
    mark = pool.snapshot("pay").floor
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'pay'"))
    assert sync_tags(pool, store).removed == ["pay"]
    assert store.retired_mark("pay") == mark
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 10)"))
    assert sync_tags(pool, store).added == ["pay"]
    with pytest.raises(CounterBehind, match=f"below {mark},"):
        refiller.refill("pay")
    assert store.get_tag("pay").max_id == 1 and r.llen("leafpool:{pay}:ids") == 0
    assert "UPDATE leaf_alloc" in pool.snapshot("pay").state["last_error"]
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE leaf_alloc SET max_id = {mark} WHERE biz_tag = 'pay'"))
    refiller.refill("pay")
    assert int(r.lpop("leafpool:{pay}:ids")) == mark  # type: ignore[arg-type]


# -- thousands of rows: registration in pipelines --------------------------------------------


def _insert_many(store: SegmentStore, segment: int, snowflake: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES "
                + ",".join(f"('s{n:04d}', 1, {10 + n})" for n in range(segment))
            )
        )
    store.add_snowflake_tag("f0000")  # creates leafpool's own tables
    if snowflake < 2:
        return
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO leafpool_snowflake_tag(biz_tag) VALUES "
                + ",".join(f"('f{n:04d}')" for n in range(1, snowflake))
            )
        )


def test_a_sync_of_many_rows_registers_every_tag_of_both_modes(
    pool: Pool, store: SegmentStore, r: redis.Redis
) -> None:
    _insert_many(store, 900, 300)  # more tags than one pipeline holds
    result = sync_tags(pool, store, wall=lambda: 1.5)
    assert result.total == 1200 and len(result.added) == 1200
    by_mode = result.added_by_mode()
    assert len(by_mode["segment"]) == 900 and len(by_mode["snowflake"]) == 300
    assert pool.tags() == sorted(result.added)
    states = pool.states(result.added, ("mode", "created_ms", "table_step"))
    assert states[0] == {"mode": "segment", "created_ms": "1500", "table_step": "10"}
    assert states[899] == {"mode": "segment", "created_ms": "1500", "table_step": "909"}
    assert states[900] == {"mode": "snowflake", "created_ms": "1500"}
    again = sync_tags(pool, store)
    assert (again.added, again.removed) == ([], [])
    assert r.hget("leafpool:{s0000}:state", "created_ms") == b"1500"  # kept, not renewed


def test_registering_many_keeps_existing_state_like_one_registration(pool: Pool) -> None:
    pool.register("old", "segment", 5, table_step=10, hwm=99)
    added = pool.register_many(
        [("old", "snowflake", 7, {"table_step": 20}), ("new", "segment", 7, {})]
    )
    assert added == [False, True]
    assert pool.snapshot("old").state == {
        "mode": "segment",
        "created_ms": "5",
        "table_step": "20",
        "hwm": "99",
    }
    assert pool.snapshot("new").state == {"mode": "segment", "created_ms": "7"}


def test_a_tag_removed_and_added_again_among_many_is_kept_and_the_rest_dropped(
    pool: Pool, store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race properties hold for a sync of many rows: of 700 tags deleted from the
    table during one sync, the one added again meanwhile is kept (its new state), the
    one added between the two reads is kept, and every other is dropped."""
    _insert_many(store, 700, 1)
    sync_tags(pool, store, wall=lambda: 1.0)
    real_list = store.list_tags

    def delete_all_then_race() -> list[TagRow]:
        with store.engine.begin() as conn:
            conn.execute(text("DELETE FROM leaf_alloc"))
        pool.drop("s0350")  # `leafpool tag remove s0350` ...
        rows = real_list()  # ... seen by the sync's database read ...
        store.add_tag("s0350", step=10)  # ... and added again at once
        pool.register("s0350", "segment", 2, table_step=10)
        store.add_tag("late", step=10)  # a tag added after the pool's tags were read
        pool.register("late", "segment", 3, table_step=10)
        return rows

    monkeypatch.setattr(store, "list_tags", delete_all_then_race)
    result = sync_tags(pool, store)
    assert len(result.removed) == 699 and "s0350" not in result.removed
    assert pool.tags() == ["f0000", "late", "s0350"]
    assert pool.snapshot("s0350").state["created_ms"] == "2"


def test_pack_writes_what_redis_py_writes() -> None:
    from redis.connection import Connection

    from leafpool.redis.pool import pack

    commands = [
        ("LLEN", "leafpool:{a.b-c_1}:ids"),
        ("HSET", "k", "f", "värde", b"\x00\r\n", 7),
        ("SET", "q", 1, "NX", "EX", 30),
        ("HMGET", "s", "mode"),
        ("SET", "1", "1", 1.5, "1.5"),  # a repeated string is looked up, a number is not
    ]
    expected = b"".join(Connection().pack_commands(commands))
    assert pack(commands) == expected
    assert pack(commands) == expected  # the second time from the looked-up encodings


def test_new_tags_are_marked_queued_before_they_are_registered(
    pool: Pool, store: SegmentStore, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With queued_seconds, a sweep or watcher reading a new tag the moment it is
    registered finds it already queued (the caller sends its refill in a batch)."""
    store.add_tag("kept", step=10)
    sync_tags(pool, store)
    _insert_many(store, 30, 3)
    seen: list[bool] = []
    real = pool.register_many

    def register_then_look(entries: list[tuple[str, str, int, dict[str, object]]]) -> list[bool]:
        seen.extend(bool(r.exists(pool.tag(e[0]).queued)) for e in entries)
        return real(entries)

    monkeypatch.setattr(pool, "register_many", register_then_look)
    result = sync_tags(pool, store, queued_seconds=60)
    assert len(result.added) == 33 and seen == [True] * 33
    assert not r.exists(pool.tag("kept").queued)  # only the new ones
    assert 0 < r.ttl(pool.tag("s0000").queued) <= 60


def test_pack_keeps_a_bounded_number_of_encodings() -> None:
    from redis.connection import Connection

    from leafpool.redis import pool_many

    commands = [("LLEN", f"leafpool:{{t{i}}}:ids") for i in range(2 * pool_many._ENCODED_MAX)]
    assert pool_many.pack(commands) == b"".join(Connection().pack_commands(commands))
    assert len(pool_many._encoded) <= pool_many._ENCODED_MAX
    assert pool_many.pack(commands) == b"".join(Connection().pack_commands(commands))


# -- the sync at rest: nothing read of Redis while the database's tags are unchanged ------


def test_an_unchanged_database_is_not_read_again_and_each_change_is_found(
    pool: Pool, store: SegmentStore, r: redis.Redis
) -> None:
    """After a full pass the syncs skip while the fingerprint and the tag count hold (a
    state the skip leaves as it is shows that nothing was read); a new row, a step
    changed in SQL, a deleted row, a snowflake tag, and a Redis that lost its tags are each
    found at the next sync."""
    memo = SyncMemo()
    store.add_tag("pay", step=10)
    store.add_tag("ship", step=10)
    assert sorted(sync_tags(pool, store, memo=memo).added) == ["pay", "ship"]
    pool.record("pay", table_step=999)  # only a full pass would put 10 back
    again = sync_tags(pool, store, memo=memo)
    assert again.unchanged and again.total == 2 and again.added == []
    assert pool.snapshot("pay").state["table_step"] == "999"

    def sql(statement: str) -> SyncResult:
        with store.engine.begin() as conn:
            conn.execute(text(statement))
        return sync_tags(pool, store, memo=memo)

    assert sql("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('new', 1, 10)"
               ).added == ["new"]
    assert pool.snapshot("pay").state["table_step"] == "10"  # the full pass
    assert sync_tags(pool, store, memo=memo).unchanged
    assert not sql("UPDATE leaf_alloc SET step = 20 WHERE biz_tag = 'ship'").unchanged
    assert pool.snapshot("ship").state["table_step"] == "20"
    assert sql("DELETE FROM leaf_alloc WHERE biz_tag = 'new'").removed == ["new"]
    store.add_snowflake_tag("order")
    assert sync_tags(pool, store, memo=memo).added == ["order"]
    assert sync_tags(pool, store, memo=memo).unchanged
    r.flushall()  # a Redis restarted empty: the tag count differs
    assert sorted(sync_tags(pool, store, memo=memo).added) == ["order", "pay", "ship"]


def test_a_step_changed_and_changed_back_between_two_syncs_stays_unchanged(
    pool: Pool, store: SegmentStore
) -> None:
    """The fingerprint is of the rows as they are: a change undone before the next sync
    leaves nothing to do."""
    memo = SyncMemo()
    store.add_tag("pay", step=10)
    sync_tags(pool, store, memo=memo)
    store.set_step("pay", 30)
    store.set_step("pay", 10)
    assert sync_tags(pool, store, memo=memo).unchanged


def test_a_tag_renamed_with_the_same_length_and_step_is_found(
    pool: Pool, store: SegmentStore
) -> None:
    """The hardest change for the fingerprint: one name for another of the same length
    and step, neither first nor last. MySQL/MariaDB: the CRC32 sum finds it at once;
    SQLite: the full pass FULL_SYNC_SECONDS after the last one."""
    memo = SyncMemo()
    clock = [1_000.0]
    for name in ("aaa", "mmm", "zzz"):
        store.add_tag(name, step=10)
    sync_tags(pool, store, memo=memo, monotonic=lambda: clock[0])
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET biz_tag = 'nnn' WHERE biz_tag = 'mmm'"))
    found = sync_tags(pool, store, memo=memo, monotonic=lambda: clock[0])
    if store.dialect == "sqlite":
        assert found.unchanged
        clock[0] += FULL_SYNC_SECONDS
        found = sync_tags(pool, store, memo=memo, monotonic=lambda: clock[0])
    assert found.added == ["nnn"] and found.removed == ["mmm"]
