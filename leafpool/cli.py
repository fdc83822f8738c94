"""``leafpool``: schema, tags, status and an in-process refill, from the command line.

Settings come from the environment (see README). Bad input prints one line naming the
field and the value and exits 2; an unavailable backend exits 1.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from leafpool.cli_common import (
    FORMAT_HELP,
    Format,
    err,
    out,
    pick_format,
    reports_errors,
    runtime,
    tsv,
)
from leafpool.cli_layout import snowflake_app
from leafpool.cli_probe import probe_app
from leafpool.cli_setup import db_app, redis_acl, redis_app
from leafpool.cli_status import status
from leafpool.core.config import get_settings
from leafpool.core.errors import (
    ConfigurationError,
    InvalidArgument,
    LeafpoolError,
)
from leafpool.core.tags import validate_tag
from leafpool.core.version import __version__
from leafpool.runtime import Runtime
from leafpool.status import plain_table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="leafpool: distributed IDs from pre-generated Redis pools.")
tag_app = typer.Typer(no_args_is_help=True, help="Business tags.")
app.add_typer(db_app, name="db")
app.add_typer(redis_app, name="redis")
app.add_typer(tag_app, name="tag")
app.add_typer(probe_app, name="probe")
app.add_typer(snowflake_app, name="snowflake")
app.command("acl", help="The same as `leafpool redis acl`.")(redis_acl)
app.command("status")(status)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"leafpool {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the release (CHANGELOG.md) and exit.")] = False,
) -> None:
    """leafpool: distributed IDs from pre-generated Redis pools."""

# -- tags -----------------------------------------------------------------------------

def _register(rt: Runtime, tag: str, mode: str, table_step: int | None = None) -> None:
    """Tell the pool at once; if Redis is down the beat's tag sync does it later."""
    from leafpool.redis.register import register

    try:
        register(rt.pool, tag, mode, table_step)
    except LeafpoolError as exc:
        err.print(f"warning: {tag}: not registered in Redis now ({exc}); "
                  "the tag sync will pick it up", highlight=False)


@tag_app.command("add")
@reports_errors
def tag_add(
    tag: str,
    mode: Annotated[str, typer.Option(help="segment or snowflake")] = "segment",
    step: Annotated[int | None, typer.Option(
        help="segment: IDs per database segment (1..1,000,000)")] = None,
    start: Annotated[int | None, typer.Option(
        help="segment: the first ID handed out (default 1, or where a removed tag of "
             "this name stopped)")] = None,
    description: Annotated[str | None, typer.Option(help="Free text")] = None,
    guard: Annotated[str | None, typer.Option(
        metavar="TABLE.COLUMN", help="segment: where the application stores the IDs "
        "([SCHEMA.]TABLE.COLUMN); ranges start above its MAX when Redis has no mark for "
        "the tag and before a heal")] = None,
) -> None:
    """Add a tag: segment mode (needs --step) or snowflake mode."""
    rt = runtime()
    if mode == "snowflake":
        if step is not None or guard is not None:
            raise InvalidArgument("step" if step is not None else "guard",
                                  step if step is not None else guard,
                                  "not used by snowflake tags; leave it out")
        rt.store.add_snowflake_tag(tag, description)
        _register(rt, tag, "snowflake")
        out.print(f"{tag}: added (snowflake)")
        return
    if mode != "segment":
        raise InvalidArgument("mode", mode, "segment or snowflake")
    if step is None:
        raise InvalidArgument("step", None, "required for segment tags: 1 to 1,000,000")
    row = rt.store.add_tag(tag, step, start, description, guard)
    _register(rt, tag, "segment", step)
    resumed = " (above what a removed tag of this name or the guard holds)" if \
        start is None and row.max_id > 1 else ""
    guarded = f", guard {guard}" if guard else ""
    out.print(f"{tag}: added (step {step}, first ID {row.max_id}{resumed}{guarded})")


@tag_app.command("guard")
@reports_errors
def tag_guard(
    tag: str,
    guard: Annotated[str | None, typer.Argument(
        metavar="[TABLE.COLUMN]", help="[SCHEMA.]TABLE.COLUMN holding the IDs the "
        "application stored; leave out to show the tag's guard")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the tag's guard")] = False,
) -> None:
    """Show, set or clear a segment tag's guard (docs/design.md §7.3): read as SELECT
    MAX(COLUMN) FROM TABLE, the worker's database user needs SELECT on TABLE."""
    if guard is not None and clear:
        raise InvalidArgument("guard", guard, "either TABLE.COLUMN or --clear, not both")
    store = runtime().store
    if clear or guard is not None:
        stored = store.set_guard(tag, guard)
        out.print(f"{tag}: guard {guard} set (it reads {stored})" if guard else
                  f"{tag}: guard cleared", highlight=False)
        return
    store.get_tag(tag)  # UnknownTag unless a segment tag
    now = store.guard(tag)
    out.print(f"{tag}: guard {now.guard} (it reads {now.max_id})" if now else
              f"{tag}: no guard", highlight=False)


#: ``leafpool tag list``'s columns: the table step is leaf_alloc's ``step`` (``step`` in
#: the JSON), the floor of the step allocations use now (``leafpool status``)
TAG_COLUMNS = ("tag", "mode", "max_id", "table step", "description")
TAG_TSV = ("tag", "mode", "max_id", "table_step", "description")


@tag_app.command("list")
@reports_errors
def tag_list(
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    fmt: Annotated[Format | None, typer.Option("--format", help=FORMAT_HELP)] = None,
) -> None:
    """List the tags: leaf_alloc (segment) and leafpool_snowflake_tag (snowflake). The
    table step is the floor of the step allocations use now (`leafpool status`: it grows
    from it under load)."""
    store = runtime().store
    rows: list[dict[str, object]] = [{"mode": "segment", **r.__dict__}
                                     for r in store.list_tags()]
    rows += [{"mode": "snowflake", "tag": t} for t in store.list_snowflake_tags()]
    fmt = Format.json if as_json else fmt
    if fmt is Format.json:
        out.print_json(json.dumps(rows))
        return
    values = [[r["tag"], r["mode"], r.get("max_id"), r.get("step"), r.get("description")]
              for r in rows]
    if fmt is Format.tsv:
        sys.stdout.write(tsv(TAG_TSV, values))
        sys.stdout.flush()
        return
    cells = [[str(v) if v is not None else ("" if i == 4 else "-") for i, v in enumerate(row)]
             for row in values]
    if pick_format(fmt, cells, TAG_COLUMNS) is Format.plain:
        sys.stdout.write(plain_table(cells, TAG_COLUMNS))
        sys.stdout.flush()
        return
    table = Table(*TAG_COLUMNS)
    for row in cells:
        table.add_row(*row)
    out.print(table)


@tag_app.command("step")
@reports_errors
def tag_step(tag: str, step: int) -> None:
    """Change a tag's step (the floor of the dynamic step)."""
    validate_tag(tag)
    rt = runtime()
    rt.store.set_step(tag, step)
    with contextlib.suppress(LeafpoolError):
        rt.pool.record(tag, table_step=step)
    out.print(f"{tag}: step {step}")


@tag_app.command("remove")
@reports_errors
def tag_remove(tag: str) -> None:
    """Remove a tag from the database and drop its pool."""
    validate_tag(tag)
    rt = runtime()
    if not rt.store.remove_snowflake_tag(tag):
        try:  # the database's max_id covers every ID the pool holds, unless the row was
            mark = rt.pool.snapshot(tag).floor  # re-created lower by hand
        except LeafpoolError as exc:
            mark = 0
            err.print(f"warning: {tag}: the pool's mark cannot be read ({exc}); keeping the "
                      "database's max_id as the retired mark", highlight=False)
        kept = rt.store.remove_tag(tag, mark)
        out.print(f"{tag}: IDs below {kept} are retired; a tag added again under this "
                  f"name starts at {kept} or above")
    try:
        rt.pool.drop(tag)
    except LeafpoolError as exc:
        err.print(f"warning: {tag}: pool keys not dropped now ({exc}); the tag sync will",
                  highlight=False)
    out.print(f"{tag}: removed")


# -- pools ----------------------------------------------------------------------------

@app.command()
@reports_errors
def refill(
    tag: str,
    force: Annotated[bool, typer.Option(help="Fill to target even above low-water")] = True,
) -> None:
    """Refill one tag now, in this process (no Celery needed)."""
    validate_tag(tag)
    result = runtime().refiller.refill(tag, force=force)
    out.print(f"{tag}: {result.summary()}")


@app.command()
@reports_errors
def sync() -> None:
    """Sync the pool's tags with leaf_alloc now (what the beat does every minute)."""
    from leafpool.housekeeping.sync import sync_tags

    rt = runtime()
    result = sync_tags(rt.pool, rt.store)
    out.print(f"{result.total} tags; added {result.added or '-'}; removed {result.removed or '-'}")


@app.command()
@reports_errors
def pop(
    tag: str,
    count: Annotated[int, typer.Option("-n", "--count", help="How many IDs")] = 1,
) -> None:
    """Take IDs from a pool with the Python client (as an application would)."""
    from leafpool.client import Client

    client = Client()
    for value in client.next_ids(tag, count):
        out.print(value)


@app.command()
@reports_errors
def decode(
    snowflake_id: Annotated[str, typer.Argument(metavar="ID", help="A snowflake ID")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Decode a snowflake ID: timestamp (ms and ISO 8601), worker ID, its DC, sequence.

    The DC is the worker ID's range under this process's LEAFPOOL_DC_COUNT (the ID does
    not carry the count): worker_id // (1024 / LEAFPOOL_DC_COUNT)."""
    from leafpool.core.snowflake_layout import dc_of
    from leafpool.core.snowflake_layout import decode as decode_id

    settings = get_settings()
    d = decode_id(snowflake_id, settings.snowflake_epoch)
    dc = dc_of(d.worker_id, settings.dc_count)
    if as_json:
        out.print_json(json.dumps({"id": snowflake_id, "timestamp_ms": d.timestamp_ms,
                                   "iso": d.iso, "worker_id": d.worker_id, "dc": dc,
                                   "dc_count": settings.dc_count, "sequence": d.sequence}))
        return
    out.print(f"timestamp {d.timestamp_ms} ({d.iso})  worker {d.worker_id}  dc {dc} "
              f"(of LEAFPOOL_DC_COUNT={settings.dc_count})  sequence {d.sequence}",
              highlight=False)


def _resolvable_host(host: str | None) -> str | None:
    """``--host``: an address, or a name that resolves to one (else uvicorn would fail
    only once started, with exit code 1)."""
    if host is None:
        return None
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise typer.BadParameter(
            f"{host!r} is neither an IP address nor a host name that resolves ({exc}); "
            "e.g. 127.0.0.1, 0.0.0.0, ::1 or localhost") from exc
    return host


def _int_in(low: int, high: int | None) -> Callable[[str | None], int | None]:
    """A callback parsing an integer option, naming the value and the range it must be in."""
    allowed = f"an integer from {low} to {high}" if high else f"an integer >= {low}"

    def check(raw: str | None) -> int | None:
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise typer.BadParameter(f"{raw!r} is not {allowed}") from None
        if value < low or (high is not None and value > high):
            raise typer.BadParameter(f"{value} is not {allowed}")
        return value

    return check


@app.command()
@reports_errors
def serve(
    host: Annotated[str | None, typer.Option(
        metavar="ADDRESS", callback=_resolvable_host,
        help="Bind to this address, as uvicorn's --host (default: LEAFPOOL_HTTP_HOST, "
             "else 127.0.0.1)")] = None,
    port: Annotated[str | None, typer.Option(
        metavar="PORT", callback=_int_in(1, 65535),
        help="Bind to this port, as uvicorn's --port (default: LEAFPOOL_HTTP_PORT, "
             "else 8080)")] = None,
    workers: Annotated[str, typer.Option(
        metavar="N", callback=_int_in(1, None),
        help="Worker processes, as uvicorn's --workers; with more than one, each builds "
             "the app from the environment (leafpool.http:app_from_env)")] = "1",
) -> None:
    """Run the HTTP service (Leaf-compatible API, /cache, /metrics, /health)."""
    from leafpool.http import serve as run

    # PORT and N are typed str so that the callbacks name a malformed value
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["http_host"] = host
    if port is not None:
        overrides["http_port"] = int(port)
    run(get_settings().model_copy(update=overrides), workers=int(workers))


@app.command()
@reports_errors
def up(
    tag: Annotated[str, typer.Option(help="The demo tag to register")] = "demo",
) -> None:
    """Bring up the embedded default (SQLite, local Redis, worker, beat) and show IDs."""
    from leafpool.embedded import up as bring_up

    def say(text: str) -> None:  # never wrapped: each command it prints copies as one line
        out.print(text, soft_wrap=True, highlight=False, markup=False)

    bring_up(get_settings(), validate_tag(tag), say=say)


def main() -> None:
    try:
        if sys.argv[1:] != ["--version"]:  # the release is printed whatever the settings
            get_settings()
    except ConfigurationError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    app()


if __name__ == "__main__":
    main()
