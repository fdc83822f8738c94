"""``python -m bench --only orm``: what leafpool IDs cost an ORM insert (issue 21, item 6;
issue 30, item 5; docs/design.md §1.3).

One MariaDB and one redis-server (the shipped config, ``appendfsync always``) on loopback;
every table has the same shape: an order row as a payment system stores one (a BIGINT
primary key, customer, reference, amount, currency, status, note, creation time). The
key's share of a row's cost depends on the row: the reference arm "keys given in the
rows" shows what sending any client-side key costs on this shape, with no pool.

- SQLAlchemy 2 ORM: the key from ``BIGINT AUTO_INCREMENT`` (the issue's baseline, "a")
  against ``mapped_column(BigInteger, primary_key=True, default=leafpool_id("bench"))``
  ("b"). Batches are ``session.execute(insert(Model), rows)`` of 1,000 rows and a commit;
  single rows ``session.add`` and a commit. Two reference arms beside "b" say where its
  time goes: the keys given in the rows by the caller (what any client-side key costs,
  no pool), and ``leafpool_id`` with ``LEAFPOOL_ORM_PREFETCH`` (one pop per 10 batches).
  One reference arm beside the single rows: ``leafpool_id`` popping from a second
  redis-server with ``appendfsync no`` (not the shipped config, not durable: it says
  what the pop's fsync costs a row, for the figure only).
- Django: a ``BigAutoField`` against ``LeafpoolIdField(tag="bench2", primary_key=True)``
  ("c"). Batches are ``bulk_create(objs, batch_size=1000)`` of 1,000 objects; single
  rows ``save()`` (autocommit: one commit each). "c" is compared with "a" (the issue's
  baseline) and with Django's own ``BigAutoField``.

The batch arms run first, then the single-row arms. Each arm inserts its rows in rounds
(a round: one batch, or a hundredth of the single rows), the arms interleaved within a
round in an order shuffled each round (seeded: the
same orders in every run; no arm always follows the same other arm), so that machine
noise hits every arm alike. An arm's ratio is the median of the rounds'
ratios of its time to its baseline's (a disk stall in one round moves a sum of times,
not the median), with the ratio of the total times beside it. Every tag's Redis list is
filled for all its rows before the first round (a ``leaf_alloc`` row in the same MariaDB
and a forced ``SegmentRefiller`` refill: what ``leafpool tag add`` and ``leafpool
refill`` do), outside the timed part, and never runs dry. Redis commands are counted by
the server (``INFO commandstats``: every command's calls but INFO's own, and ``LPOP``
alone) over each arm's timed inserts, per 1,000 rows. After the run every table is
checked: every row there, under a distinct key.

The Django arms need Django (the ``django`` or ``test`` extra; ``./dev bench`` installs
it) and :mod:`leafpool.orm.django`; without either they are left out, saying so.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import BigInteger, DateTime, String, create_engine, insert
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from bench import servers
from bench.measure import met
from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.orm.batch import IdBatches
from leafpool.orm.sqlalchemy import leafpool_id
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore

SA_TAG, DJANGO_TAG, PREFETCH_TAG, NOSYNC_TAG = "bench", "bench2", "bench3", "bench4"
PREFETCH = 10_000  # the reference arm's LEAFPOOL_ORM_PREFETCH
# issue 30, item 5: batches within 1.1x of AUTO_INCREMENT's time, single rows within 1.3x
TARGETS = {"batch": 1.1, "single": 1.3}


@dataclass(frozen=True)
class OrmSizes:
    batch_rows: int = 100_000  # rows per batch arm, over all rounds
    single_rows: int = 10_000  # rows per single-row arm, over all rounds
    rounds: int = 100  # a round: one batch (and a hundredth of the single rows) per arm
    batch: int = 1_000


FULL = OrmSizes()
QUICK = OrmSizes(batch_rows=20_000, single_rows=2_000, rounds=20)
SMOKE = OrmSizes(batch_rows=2_000, single_rows=40, rounds=2)


# -- the arms ----------------------------------------------------------------------------

@dataclass
class Arm:
    name: str
    kind: str  # "batch" or "single"
    baseline: str | None  # the arm its ratio is against
    insert: Callable[[int, int], None]  # insert(first row number, rows)
    rows: int = 0
    seconds: list[float] = field(default_factory=list)  # per round
    commands: int = 0  # Redis commands over the timed inserts (INFO's own not counted)
    lpops: int = 0
    also: str | None = None  # a second baseline (Django's own)
    target: bool = False  # held to the target for its kind (TARGETS)
    table: str = ""  # where its rows go (checked after the run)
    redis_url: str | None = None  # the server it pops from, if not the shipped-config one

    @property
    def total_s(self) -> float:
        return sum(self.seconds)


class _Base(DeclarativeBase):
    pass


class _Order:
    """The columns of every arm's table but the key: an order as a payment system stores one."""

    customer_id: Mapped[int] = mapped_column(BigInteger)
    ref: Mapped[str] = mapped_column(String(32))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    status: Mapped[str] = mapped_column(String(16))
    note: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime)


class AutoRow(_Order, _Base):
    __tablename__ = "orm_sa_auto"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)


class GivenRow(_Order, _Base):
    """Keys given in the rows by the caller: what any client-side key costs, no pool."""

    __tablename__ = "orm_sa_given"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


def _leafpool_model(name: str, table: str, tag: str, batches: IdBatches) -> type[_Base]:
    return type(name, (_Order, _Base), {
        "__tablename__": table,
        "__annotations__": {"id": Mapped[int]},
        "id": mapped_column(BigInteger, primary_key=True, autoincrement=False,
                            default=leafpool_id(tag, batches=batches)),
    })


CREATED = datetime(2026, 11, 25, 12, 0, 0)


def order(i: int, aware: bool = False) -> dict[str, Any]:
    """Row ``i`` of every arm: an order as a payment system stores one (its key apart)."""
    return {"customer_id": 1_000_000 + i % 9_973, "ref": f"ORD-{i:012d}",
            "amount_cents": 1_999 + i % 50_000, "currency": "EUR", "status": "pending",
            "note": f"web checkout, cart {i % 1_000:04d}",
            "created_at": CREATED.replace(tzinfo=UTC) if aware else CREATED}


def _rows(first: int, n: int, keyed: bool = False) -> list[dict[str, Any]]:
    if keyed:
        return [{"id": i, **order(i)} for i in range(first, first + n)]
    return [order(i) for i in range(first, first + n)]


A = "a: SQLAlchemy, AUTO_INCREMENT"


def sqlalchemy_arms(engine: Engine, batches: IdBatches, ahead: IdBatches,
                    unsynced: IdBatches, nosync_url: str, batch: int) -> list[Arm]:
    """(a), (b), the two references beside (b), the single-row pair and the reference
    beside it (``unsynced``: a Redis with appendfsync no)."""
    pooled = _leafpool_model("LeafpoolRow", "orm_sa_leafpool", SA_TAG, batches)
    pooled_ahead = _leafpool_model("PrefetchRow", "orm_sa_prefetch", PREFETCH_TAG, ahead)
    pooled_nosync = _leafpool_model("NoSyncRow", "orm_sa_nosync", NOSYNC_TAG, unsynced)
    _Base.metadata.create_all(engine)

    def batches_of(model: type[_Base], keyed: bool = False) -> Callable[[int, int], None]:
        def run(first: int, rows: int) -> None:
            with Session(engine) as session:
                for lo in range(first, first + rows, batch):
                    session.execute(insert(model),
                                    _rows(lo, min(batch, first + rows - lo), keyed))
                    session.commit()
        return run

    def singles_of(model: type[_Base]) -> Callable[[int, int], None]:
        def run(first: int, rows: int) -> None:
            with Session(engine) as session:
                for i in range(first, first + rows):
                    session.add(model(**order(i)))
                    session.commit()
        return run

    sa_single = "SQLAlchemy single, AUTO_INCREMENT"
    return [
        Arm(A, "batch", None, batches_of(AutoRow), table=AutoRow.__tablename__),
        Arm("b: SQLAlchemy, leafpool_id default", "batch", A, batches_of(pooled),
            target=True, table=pooled.__tablename__),
        Arm("  ref: keys given in the rows (no pool)", "batch", A,
            batches_of(GivenRow, keyed=True), table=GivenRow.__tablename__),
        Arm(f"  ref: leafpool_id, ORM_PREFETCH={PREFETCH:,}", "batch", A,
            batches_of(pooled_ahead), table=pooled_ahead.__tablename__),
        Arm(sa_single, "single", None, singles_of(AutoRow), table=AutoRow.__tablename__),
        Arm("SQLAlchemy single, leafpool_id default", "single", sa_single,
            singles_of(pooled), target=True, table=pooled.__tablename__),
        Arm("  ref: leafpool_id, Redis appendfsync no (not durable)", "single", sa_single,
            singles_of(pooled_nosync), table=pooled_nosync.__tablename__,
            redis_url=nosync_url),
    ]


def django_arms(db_url: str, redis_url: str, batch: int) -> tuple[list[Arm], str]:
    """The Django arms, or none and why."""
    try:
        import django  # noqa: F401
    except ModuleNotFoundError:
        return [], "Django is not installed (pip install .[django]; ./dev bench has it)"
    try:
        import leafpool.orm.django  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "leafpool.orm.django":
            raise
        return [], "leafpool.orm.django is not there yet"
    from bench.orm_django_app import setup

    models = setup(db_url, redis_url)
    auto, pooled = models.AutoRow, models.LeafpoolRow

    def batches_of(model: Any) -> Callable[[int, int], None]:
        def run(first: int, rows: int) -> None:
            for lo in range(first, first + rows, batch):
                objs = [model(**order(i, aware=True))
                        for i in range(lo, min(lo + batch, first + rows))]
                model.objects.bulk_create(objs, batch_size=batch)
        return run

    def singles_of(model: Any) -> Callable[[int, int], None]:
        def run(first: int, rows: int) -> None:
            for i in range(first, first + rows):
                model(**order(i, aware=True)).save()
        return run

    dj = "Django bulk_create, BigAutoField"
    dj_single = "Django save(), BigAutoField"
    return [
        Arm(dj, "batch", A, batches_of(auto), table=auto._meta.db_table),
        Arm("c: Django bulk_create, LeafpoolIdField", "batch", A, batches_of(pooled),
            also=dj, target=True, table=pooled._meta.db_table),
        Arm(dj_single, "single", None, singles_of(auto), table=auto._meta.db_table),
        Arm("Django save(), LeafpoolIdField", "single", dj_single, singles_of(pooled),
            target=True, table=pooled._meta.db_table),
    ], ""


# -- pools and counts --------------------------------------------------------------------

def fill(redis_url: str, db_url: str, tags: dict[str, int]) -> None:
    """Each tag's list filled with at least its count of IDs, the product's way: a
    ``leaf_alloc`` row and a forced refill (``leafpool tag add``, ``leafpool refill``)."""
    r = redis.Redis.from_url(redis_url)
    store = SegmentStore.from_url(db_url)
    try:
        store.init_schema()
        for tag, need in tags.items():
            step = min(need, 1_000_000)
            store.add_tag(tag, step=step)
            settings = load_settings(redis_url=redis_url, database_url=db_url,
                                     pool_floor=need, pool_ceiling=need, max_step=step,
                                     chunk_size=10_000, reserve_seconds=1, outage_seconds=0)
            SegmentRefiller(Pool(r), store, settings).refill(tag, force=True)
            have = Pool(r).snapshot(tag).length
            if have < need:
                raise RuntimeError(f"{tag}: {have:,} IDs pooled, {need:,} needed")
    finally:
        store.engine.dispose()
        r.close()


def _counts(r: redis.Redis) -> tuple[int, int]:
    """(calls of every command but INFO, LPOP calls) since the server started."""
    stats: dict[str, dict[str, int]] = r.info("commandstats")  # type: ignore[assignment]
    total = sum(s["calls"] for name, s in stats.items() if name != "cmdstat_info")
    return total, stats.get("cmdstat_lpop", {}).get("calls", 0)


def measure(arms: list[Arm], r: redis.Redis, sizes: OrmSizes) -> dict[str, int]:
    """Every arm's rows in ``sizes.rounds`` rounds, the arms interleaved (a warm-up
    batch or row each first, not counted); the rows written to each table."""
    start = {arm.name: 1 for arm in arms}
    written: dict[str, int] = {}
    for arm in arms:  # connections, prepared scripts, the first pop: not measured
        warm = sizes.batch if arm.kind == "batch" else 1
        arm.insert(start[arm.name], warm)
        start[arm.name] += warm
        written[arm.table] = written.get(arm.table, 0) + warm
    order = random.Random(21)  # the same orders in every run
    servers_by = {arm.redis_url: redis.Redis.from_url(arm.redis_url)
                  for arm in arms if arm.redis_url}
    for n in range(sizes.rounds):
        for arm in order.sample(arms, len(arms)):
            total = sizes.batch_rows if arm.kind == "batch" else sizes.single_rows
            rows = total * (n + 1) // sizes.rounds - total * n // sizes.rounds
            server = servers_by[arm.redis_url] if arm.redis_url else r
            before = _counts(server)
            t0 = time.perf_counter()
            arm.insert(start[arm.name], rows)
            arm.seconds.append(time.perf_counter() - t0)
            after = _counts(server)
            start[arm.name] += rows
            arm.rows += rows
            arm.commands += after[0] - before[0]
            arm.lpops += after[1] - before[1]
            written[arm.table] += rows
    for server in servers_by.values():
        server.close()
    return written


def check(engine: Engine, written: dict[str, int]) -> None:
    """Every row is in its table, under a distinct key."""
    with engine.connect() as conn:
        for name, rows in written.items():
            got, keys = conn.exec_driver_sql(
                f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {name}").one()
            if got != rows or keys != rows:
                raise RuntimeError(f"{name}: {got:,} rows ({keys:,} keys), {rows:,} inserted")


def _round_ratios(arm: Arm, base: Arm) -> list[float]:
    return [t / b for t, b in zip(arm.seconds, base.seconds, strict=True)]


def _ratio(arm: Arm, base: Arm) -> float:
    """The arm's time over its baseline's: the median of the rounds' ratios (one stall
    of the disk in one round moves a sum, not this)."""
    return statistics.median(_round_ratios(arm, base))


def _ratio_cell(arm: Arm, base: Arm | None) -> str:
    if base is None:
        return "1.00x (baseline)"
    return f"{_ratio(arm, base):.2f}x ({arm.total_s / base.total_s:.2f}x)"


def _rounds_cell(arm: Arm) -> str:
    """A round's median and slowest time: a stall lands in one round of one arm."""
    if not arm.seconds:
        return "-"
    return f"{statistics.median(arm.seconds) * 1000:.1f} / {max(arm.seconds) * 1000:.1f}"


def table(arms: list[Arm], sizes: OrmSizes, skipped: str) -> Table:
    by = {arm.name: arm for arm in arms}
    t = Table(title=f"ORM inserts into MariaDB (Redis appendfsync always): batches of "
                    f"{sizes.batch:,} rows and single rows, {sizes.rounds} interleaved rounds; "
                    f"time vs the baseline: the median of the rounds' ratios (the ratio of "
                    f"the total times)")
    for col in ("arm", "rows", "seconds", "rows/s", "time vs baseline",
                "vs Django BigAutoField", "round: median / slowest ms",
                "Redis cmds / 1,000 rows", "LPOP / 1,000 rows"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for arm in arms:
        base = by.get(arm.baseline) if arm.baseline else None
        also = by.get(arm.also) if arm.also else None
        per = 1000 / arm.rows if arm.rows else 0.0
        t.add_row(arm.name, f"{arm.rows:,}", f"{arm.total_s:.2f}",
                  f"{arm.rows / arm.total_s:,.0f}" if arm.total_s else "-",
                  _ratio_cell(arm, base), _ratio_cell(arm, also) if also else "",
                  _rounds_cell(arm), f"{arm.commands * per:.1f}", f"{arm.lpops * per:.1f}")
    if skipped:
        t.caption = f"Django arms left out: {skipped}"
    return t


def targets(arms: list[Arm]) -> Table:
    by = {arm.name: arm for arm in arms}
    t = Table(title=f"Targets (issue 30, item 5): leafpool's batch arms within "
                    f"{TARGETS['batch']}x of AUTO_INCREMENT's time (a), single rows within "
                    f"{TARGETS['single']}x of the same ORM's AUTO_INCREMENT, on the shipped "
                    f"Redis configuration (appendfsync always) with the cross-process order "
                    f"(LEAFPOOL_ORM_PREFETCH=0)")
    for col in ("arm", "against", "median of rounds", "total times", "target", "met"):
        t.add_column(col)
    for arm in arms:
        if not arm.target or arm.baseline is None:
            continue
        target = TARGETS[arm.kind]
        # the baseline (a), and for Django the same ORM's AUTO_INCREMENT beside it
        for name in (arm.baseline, arm.also):
            if name is None or name not in by:
                continue
            base = by[name]
            ratio = _ratio(arm, base)
            t.add_row(arm.name, name, f"{ratio:.3f}x", f"{arm.total_s / base.total_s:.3f}x",
                      f"<= {target}x", met(ratio <= target))
    return t


def main(console: Console, sizes: OrmSizes) -> list[Arm]:
    with servers.redis() as redis_server, servers.mariadb() as db, \
            servers.redis("--appendfsync", "no") as nosync_server:
        redis_url, db_url = redis_server.extra["url"], db.extra["url"]
        nosync_url = nosync_server.extra["url"]
        per_tag = sizes.batch_rows + sizes.single_rows + sizes.batch + 1
        fill(redis_url, db_url, {SA_TAG: per_tag, DJANGO_TAG: per_tag,
                                 PREFETCH_TAG: per_tag + PREFETCH})
        # the reference's pool: the same tag's next IDs, on the Redis that does not fsync
        fill(nosync_url, db_url, {NOSYNC_TAG: sizes.single_rows + 1})
        r = redis.Redis.from_url(redis_url)
        settings = load_settings(redis_url=redis_url, empty_policy="raise")
        nosync = load_settings(redis_url=nosync_url, empty_policy="raise")
        batches = IdBatches(lambda: Client(settings=settings), prefetch=0)
        ahead = IdBatches(lambda: Client(settings=settings), prefetch=PREFETCH)
        unsynced = IdBatches(lambda: Client(settings=nosync), prefetch=0)
        engine = create_engine(db_url)
        try:
            arms = sqlalchemy_arms(engine, batches, ahead, unsynced, nosync_url, sizes.batch)
            more, skipped = django_arms(db_url, redis_url, sizes.batch)
            arms += more
            arms.sort(key=lambda a: a.kind)  # the batch arms first
            written: dict[str, int] = {}
            for kind in ("batch", "single"):  # a phase each: 100 commits of single rows
                # leave the disk busier than one batch does, whichever arm comes next
                for name, rows in measure([a for a in arms if a.kind == kind], r,
                                          sizes).items():
                    written[name] = written.get(name, 0) + rows
            check(engine, written)
        finally:
            engine.dispose()
            batches.close()
            ahead.close()
            unsynced.close()
            r.close()
    console.print(table(arms, sizes, skipped))
    console.print(targets(arms))
    return arms
