"""``leafpool snowflake layout``: the DC layout a registry records, every worker ID it holds
or leases, and ``--set``, which records the configured layout (``LEAFPOOL_DC_ID``,
``LEAFPOOL_DC_COUNT``) on a registry that served one site and now serves one DC of
several (docs/design.md §12.1, docs/how-to/multiple-dcs.md).

``--set`` records a layout only within the recorded one's range (a registry keeps a part
of its range; the rest may be leased by another DC's registry, which this one cannot
see), and only when no worker ID that is held, or may still be, lies outside the new
range:

- ``zk``: every forever node: its sequence is its identity's worker ID for ever (the DC's
  first ID + the sequence, under the recorded layout and under the new one), whether its
  process runs or not;
- ``zk_recycle``, ``k8s``: every lease node (a live session), and a mark node whose mark
  lies ahead of the clock (IDs up to it may have been handed out);
- ``mysql``: every row whose lease has not expired (``LEAFPOOL_SNOWFLAKE_LEASE_SECONDS``,
  the workers' value), or whose mark lies ahead of the clock;
- ``local``: every worker ID whose lock a process on the host holds, or whose cache file's
  mark lies ahead of the clock.

Against a concurrent claim: ``mysql`` in one transaction holding the record for update
(each claim share-locks it in its own transaction); ZooKeeper and ``local`` write a
"changing" record first (every claim refused), then read the holders, then write the new
record, or put the old one back; each claim reads the record again once its node or lock
exists, so either this command sees the claim or the claim sees the record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from sqlalchemy import case, func, literal_column, or_, select
from sqlalchemy.exc import DBAPIError

from leafpool.core.config import Settings, hide_password
from leafpool.core.credentials import ZK_USERNAME_ENV
from leafpool.core.errors import BackendUnavailable, ConfigurationError
from leafpool.core.setting_values import validate_name
from leafpool.core.snowflake_layout import DcRange, dc_range, iso_utc, wall_clock_ms
from leafpool.database.engine import driver_code, make_engine, transaction
from leafpool.database.layout_table import WORKERID_REGISTRY, snowflake_layout
from leafpool.database.schema import MYSQL_TABLE_DENIED, probe
from leafpool.snowflake.registry import layout, zk_acl
from leafpool.snowflake.registry.cache import read_all
from leafpool.snowflake.registry.layout_report import SET_BY, Held, Report, pair, refused, within
from leafpool.snowflake.registry.mysql import REGISTRY_TIMEOUTS
from leafpool.snowflake.registry.mysql import _t as workerid_alloc
from leafpool.snowflake.registry.zk_common import KAZOO_ERRORS, close, dump, load, timestamp_of

_LOCK = re.compile(r"^worker-(\d+)\.lock$")


def inspect(settings: Settings) -> Report:
    """The registry's record and every worker ID it holds (nothing written)."""
    return _run(settings, write=False)


def set_layout(settings: Settings) -> Report:
    """Record the configured layout, or raise :class:`ConfigurationError` naming the
    worker IDs held (or possibly in use) outside its range."""
    return _run(settings, write=True)


def _run(settings: Settings, write: bool) -> Report:
    mode = settings.snowflake_mode or "local"
    cfg = layout.settings_range(settings)
    name = validate_name(settings.snowflake_name)
    if mode == "mysql":
        return _mysql(settings, cfg, write)
    if mode == "local":
        return _local(settings, name, cfg, write)
    return _zookeeper(settings, mode, name, cfg, write)


# -- ZooKeeper (zk, zk_recycle and k8s share a tree) ------------------------------------

def _zk_client(settings: Settings) -> KazooClient:
    hosts = settings.zk_hosts.strip()
    if not hosts:
        raise ConfigurationError("LEAFPOOL_ZK_HOSTS", settings.zk_hosts,
                                 "a ZooKeeper connect string is required for this mode")
    client = KazooClient(hosts=hosts, timeout=10,
                         **zk_acl.client_options(settings.zk_login))
    try:
        client.start(timeout=10)
    except KAZOO_ERRORS as exc:
        close(client)
        raise BackendUnavailable(f"ZooKeeper {hosts} unreachable: {exc!r}") from exc
    return client


def _children(client: KazooClient, path: str) -> list[str]:
    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []


def _zk_held(client: KazooClient, base: str, before: DcRange, cfg: DcRange) -> list[Held]:
    held: list[Held] = []
    now = wall_clock_ms()
    for child in _children(client, f"{base}/forever"):
        ident, sep, seq = child.rpartition("-")
        if sep and seq.isdigit():
            held.append(Held(before.first + int(seq), f"forever node {base}/forever/{child}",
                             ident, "mode zk: its identity's worker ID for ever", True,
                             cfg.first + int(seq)))
    leased = set()
    for kind in ("lease", "hw"):
        for child in _children(client, f"{base}/recycle/{kind}"):
            path = f"{base}/recycle/{kind}/{child}"
            if not child.isdigit() or (kind == "hw" and int(child) in leased):
                continue
            try:
                raw, _stat = client.get(path)
            except NoNodeError:
                continue
            who = str(load(raw).get("identity", "?"))
            if kind == "lease":
                leased.add(int(child))
                held.append(Held(int(child), f"lease {path}", who, "leased", True))
                continue
            mark = timestamp_of(raw)
            ahead = mark > now
            state = f"not leased, mark {iso_utc(mark) if mark else '-'}" + (
                " (ahead of the clock: IDs up to it may have been handed out)" if ahead else "")
            held.append(Held(int(child), f"mark {path}", who, state, ahead))
    return sorted(held, key=lambda h: h.worker_id)


def _zk_notes(client: KazooClient, base: str, cfg: DcRange) -> list[str]:
    """Mode zk's sequence: ZooKeeper numbers a new forever node with its parent's child
    version, never reused; from ``cfg.size`` on, a new identity is refused."""
    stat = client.exists(f"{base}/forever")
    if stat is None:  # mode zk never ran here
        return []
    fits = max(0, cfg.size - stat.cversion)
    return [f"mode zk: ZooKeeper's next sequence under {base}/forever is {stat.cversion}: "
            f"{fits} more new identities fit in {cfg.describe()}, the next ones are "
            "refused (a sequence is never reused: mode zk_recycle, or a new "
            "LEAFPOOL_SNOWFLAKE_NAME, has room)"]


def _zookeeper(settings: Settings, mode: str, name: str, cfg: DcRange, write: bool) -> Report:
    base = f"/snowflake/{name}"
    path = f"{base}/layout"
    where = f"ZooKeeper {path}"
    client = _zk_client(settings)
    try:
        for _ in range(5):
            try:
                raw, stat = client.get(path)
                recorded: tuple[int, int] | None
                recorded, half_done = pair(load(raw), where)
            except NoNodeError:
                raw, stat, recorded, half_done = None, None, None, False
            history = any(_children(client, f"{base}/{d}") for d in ("forever", "recycle/hw"))
            serves = recorded or (layout.UNRECORDED if history else None)
            before = dc_range(*(serves or layout.UNRECORDED))
            report = Report(mode, where, None if half_done else recorded, serves, cfg, [])
            if not write:
                report.held = _zk_held(client, base, before, cfg)
                report.notes = _zk_notes(client, base, cfg)
                return report
            within(before, cfg, where)
            if serves == (cfg.dc_id, cfg.dc_count) and recorded and not half_done:
                report.held = _zk_held(client, base, before, cfg)
                report.notes = _zk_notes(client, base, cfg)
                return report
            changing = dump(layout.changing_data(before, cfg))
            try:  # 1. every claim is refused from here on
                if stat is None:
                    client.create(path, changing, makepath=True)
                    version = 0
                else:
                    version = client.set(path, changing, version=stat.version).version
            except (NodeExistsError, BadVersionError):
                continue  # a worker recorded its layout meanwhile: read it again
            report.held = _zk_held(client, base, before, cfg)  # 2. read after that write
            if report.outside():  # 3. as it was
                if stat is None:
                    client.delete(path, version=version)
                else:
                    client.set(path, raw if not half_done else dump(
                        layout.record_data(before)), version=version)
                raise refused(report, before)
            client.set(path, dump(layout.record_data(cfg)), version=version)
            report.notes = _zk_notes(client, base, cfg)
            report.recorded, report.serves, report.written = (
                (cfg.dc_id, cfg.dc_count), (cfg.dc_id, cfg.dc_count), True)
            return report
        raise BackendUnavailable(f"{where} kept changing; nothing written")
    except NoAuthError:
        raise ConfigurationError(
            ZK_USERNAME_ENV, settings.zk_login.username,
            f"the ZooKeeper identity that owns {base}: ZooKeeper refused (NoAuth); run "
            "the command with the workers' LEAFPOOL_ZK_USERNAME and LEAFPOOL_ZK_PASSWORD"
        ) from None
    except KAZOO_ERRORS as exc:
        raise BackendUnavailable(f"{where}: {exc!r}") from exc
    finally:
        close(client)


# -- MySQL -------------------------------------------------------------------------------

def _mysql(settings: Settings, cfg: DcRange, write: bool) -> Report:
    t, a = snowflake_layout, workerid_alloc
    where = f"MySQL {t.name} registry='{WORKERID_REGISTRY}'"
    engine = make_engine(settings.database_url, REGISTRY_TIMEOUTS,
                         settings.database_tls_used)
    lease_s = max(1, int(-(-settings.snowflake_lease_seconds // 1)))
    try:
        found = probe(engine, t, "snowflake layout")
        if found != "readable":
            raise ConfigurationError(
                layout.DC_COUNT_ENV, cfg.dc_count,
                f"needs the {t.name} table, and it is {found} to this user: run leafpool "
                "db init, and this command under the admin's grants (leafpool db grants "
                "admin)")
        has_rows = probe(engine, a, "snowflake layout") == "readable"
        chosen = select(t.c.dc_id, t.c.dc_count).where(t.c.registry == WORKERID_REGISTRY)
        if write:  # a registry of before the record: recorded as it served, DC 0 of 1
            with transaction(engine, f"{SET_BY}: the record of before") as conn:
                if conn.execute(chosen).first() is None:
                    conn.execute(t.insert().prefix_with("IGNORE").values(
                        registry=WORKERID_REGISTRY, dc_id=0, dc_count=1, written_by=SET_BY))
        with transaction(engine, SET_BY if write else "snowflake layout") as conn:
            row = conn.execute(chosen.with_for_update() if write else chosen).first()
            recorded = None if row is None else (int(row.dc_id), int(row.dc_count))
            held: list[Held] = []
            if has_rows:
                cutoff = func.timestampadd(literal_column("SECOND"), -lease_s, func.now())
                expired = case((or_(a.c.update_time.is_(None), a.c.update_time < cutoff), 1),
                               else_=0).label("expired")
                query = select(a.c.id, a.c.ip_port, a.c.update_time, a.c.max_timestamp, expired)
                rows = conn.execute(query.with_for_update(read=True) if write else query)
                now = wall_clock_ms()
                for r in rows:
                    mark = int(r.max_timestamp or 0)
                    ahead = mark > now
                    state = (f"lease expired (renewed {r.update_time or 'never: released'})"
                             if r.expired else f"leased (renewed {r.update_time})")
                    if ahead:
                        state += f", mark {iso_utc(mark)} ahead of the clock"
                    held.append(Held(int(r.id), f"row id={r.id}", str(r.ip_port), state,
                                     not r.expired or ahead))
            serves = recorded or (layout.UNRECORDED if held else None)
            report = Report("mysql", where, recorded, serves, cfg,
                            sorted(held, key=lambda h: h.worker_id))
            if not write or recorded == (cfg.dc_id, cfg.dc_count):
                return report
            before = dc_range(*(serves or layout.UNRECORDED))
            within(before, cfg, where)
            if report.outside():
                raise refused(report, before)
            conn.execute(t.update().where(t.c.registry == WORKERID_REGISTRY).values(
                dc_id=cfg.dc_id, dc_count=cfg.dc_count, written_by=SET_BY))
        report.recorded = report.serves = (cfg.dc_id, cfg.dc_count)
        report.written = True
        return report
    except BackendUnavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, DBAPIError) and driver_code(cause) == MYSQL_TABLE_DENIED:
            raise ConfigurationError(
                "LEAFPOOL_DATABASE_URL", hide_password(settings.database_url),
                f"a user with the admin's grants (leafpool db grants admin): {SET_BY} "
                f"updates {t.name}, which the worker's grants do not allow ({cause.orig})"
            ) from exc
        raise
    finally:
        engine.dispose()


# -- local: a host's cache directory ----------------------------------------------------

def _local_held(directory: Path) -> list[Held]:
    now = wall_clock_ms()
    marks: dict[int, tuple[int, str]] = {}
    for _path, rec in read_all(directory, SET_BY):
        if rec.last_timestamp >= marks.get(rec.worker_id, (-1, ""))[0]:
            marks[rec.worker_id] = (rec.last_timestamp, rec.identity or "?")
    locked = set()
    held: list[Held] = []
    for lock in sorted(directory.glob("worker-*.lock")):
        found = _LOCK.match(lock.name)
        if found is None:
            continue
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            worker = int(found[1])
            locked.add(worker)
            held.append(Held(worker, f"lock {lock}", marks.get(worker, (0, "?"))[1],
                             "held by a process on this host", True))
        finally:
            os.close(fd)  # drops the lock taken, if any
    for worker, (mark, who) in marks.items():
        if worker not in locked:
            ahead = mark > now
            held.append(Held(worker, f"cache file in {directory}", who,
                             f"not held, mark {iso_utc(mark)}" + (
                                 " (ahead of the clock)" if ahead else ""), ahead))
    return sorted(held, key=lambda h: h.worker_id)


def _local(settings: Settings, name: str, cfg: DcRange, write: bool) -> Report:
    directory = Path(settings.snowflake_cache_dir) / name
    path = directory / "layout.record"
    where = f"the layout record {path}"
    try:
        raw: str | None = path.read_text()
    except FileNotFoundError:
        raw = None
    recorded, half_done = (None, False) if raw is None else pair(_json(raw), where)
    history = directory.is_dir() and any(directory.glob("*.json"))
    serves = recorded or (layout.UNRECORDED if history else None)
    before = dc_range(*(serves or layout.UNRECORDED))
    report = Report("local", where, None if half_done else recorded, serves, cfg, [])
    if not write or (serves == (cfg.dc_id, cfg.dc_count) and recorded and not half_done):
        report.held = _local_held(directory) if directory.is_dir() else []
        return report
    within(before, cfg, where)
    directory.mkdir(parents=True, exist_ok=True)
    _replace(path, layout.changing_data(before, cfg))  # 1. every claim refused
    report.held = _local_held(directory)  # 2. the locks, tried after that write
    if report.outside():  # 3. as it was
        if raw is None:
            path.unlink()
        else:
            _replace(path, layout.record_data(before))
        raise refused(report, before)
    _replace(path, layout.record_data(cfg))
    report.recorded = report.serves = (cfg.dc_id, cfg.dc_count)
    report.written = True
    return report


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _replace(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.set")
    tmp.write_text(json.dumps(data) + "\n")
    with contextlib.suppress(OSError):
        os.chmod(tmp, 0o644)
    os.replace(tmp, path)
