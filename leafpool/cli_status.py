"""``leafpool status``: each tag's pool, as a table for a person or as rows for a script.

``--format`` (the rule of :func:`leafpool.cli_common.pick_format`, shared with ``leafpool
tag list``): ``table`` (rich's, for a terminal wide enough for it), ``plain`` (a header and
one line per tag, columns aligned, nothing wrapped or cut: the default when stdout is not a
terminal or the terminal is narrower than the table), ``tsv`` (:data:`TSV_FIELDS`: plain
values under the JSON's field names, the notices on stderr: for ``cut`` and ``awk``) and
``json`` (``--json``: every field, raw).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Generic, NamedTuple, TypeVar, cast

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
from leafpool.core.collector import collector_paused as _collector_paused
from leafpool.core.errors import UnknownTag
from leafpool.core.tags import validate_tag
from leafpool.status import (
    STATUS_COLUMNS,
    TagStatus,
    footnotes,
    grown,
    notices,
    plain_table,
    pool_status,
    status_detail,
    status_row,
)
from leafpool.status_json import status_json

if TYPE_CHECKING:  # the command's start needs no redis-py (tests/test_cli_start.py)
    from leafpool.redis.pool import Pool

#: ``--format tsv``: plain values under the JSON's field names (integers without
#: separators, times as ms since the epoch, durations in seconds, rates in IDs/s, an empty
#: cell for none), the last error last
TSV_FIELDS = (
    "tag", "mode", "length", "target", "reserve_size", "step", "table_step", "worker_ids",
    "max_id", "rate", "peak_rate", "list_seconds", "reserve_seconds", "seconds_left",
    "last_refill_ms", "last_refill_result", "empty_hits", "dry_since_ms", "gaps",
    "db_unreachable_ms", "last_error_ms", "last_error",
)


@reports_errors
def status(
    tags: Annotated[list[str] | None, typer.Argument(
        help="Only these tags, each in full: a field a line, nothing cut")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    fmt: Annotated[Format | None, typer.Option(
        "--format", help=FORMAT_HELP)] = None,
    watch: Annotated[float, typer.Option(help="Refresh every N seconds (0: once)")] = 0.0,
) -> None:
    """Per tag: list length vs target, reserve, step, max_id, rate, seconds held at the
    peak and left at the rate now, last refill; the database and dry tags above."""
    rt = runtime()
    for tag in tags or []:
        validate_tag(tag)
    chosen = Format.json if as_json else fmt
    while True:
        with _collector_paused():  # the printing too
            if tags and chosen is None:
                _print_details(pool_status(rt.pool, tags), clear=bool(watch))
            else:
                now_ms = time.time() * 1000
                names = tags if tags is not None else rt.pool.tags()
                if chosen is Format.json:  # written as read, a chunk at a time
                    for part in status_json_parts(rendered(rt.pool, names, now_ms, json_body)):
                        sys.stdout.write(part)
                    sys.stdout.flush()
                else:
                    render = _tsv_part if chosen is Format.tsv else _table_part
                    _print_status(list(rendered(rt.pool, names, now_ms, render)), chosen,
                                  clear=bool(watch))
        if not watch:
            return
        time.sleep(watch)


def _print_details(rows: list[TagStatus], clear: bool) -> None:
    if clear:
        out.clear()
    for row in rows:
        if row.mode == "?":
            raise UnknownTag(row.tag)
        sys.stdout.write(status_detail(row) + "\n")
    sys.stdout.flush()


def json_body(rows: Sequence[TagStatus]) -> str:
    """:func:`~leafpool.status_json.status_json` of ``rows`` without its brackets: a tag a
    line, no line break after the last ("" for no rows)."""
    return status_json(rows)[2:-3] if rows else ""


def status_json_parts(bodies: Iterable[str]) -> Iterator[str]:
    """The JSON array of :func:`json_body` pieces, in pieces (written as each is read:
    100,000 tags' statuses at once held 680 MB; plain writes: rich's highlighting took
    seconds for 10,000 tags)."""
    first = True
    for body in bodies:
        if body:
            yield ("[\n" if first else ",\n") + body
            first = False
    yield "[]\n" if first else "\n]\n"


class TablePart(NamedTuple):
    """A chunk of tags as the table and the TSV show them: each tag's cells (the TSV's
    values), and the statuses that have something to say above or below the table (what
    :func:`~leafpool.status.notices` and :func:`~leafpool.status.footnotes` say of all the
    tags, they say of these)."""

    cells: list[list[str]] | list[list[object]]
    said: list[TagStatus]


def says_something(r: TagStatus) -> bool:
    """Whether :func:`~leafpool.status.notices` or :func:`~leafpool.status.footnotes` say
    something of this tag: what they say of many tags, they say of those of them for which
    this is true."""
    return (r.db_unreachable_ms is not None or r.dry_since_ms is not None or r.counter_behind
            or grown(r))


def _table_part(rows: Sequence[TagStatus]) -> TablePart:
    return TablePart([status_row(r) for r in rows], [r for r in rows if says_something(r)])


def _tsv_part(rows: Sequence[TagStatus]) -> TablePart:
    return TablePart([[getattr(r, name) for name in TSV_FIELDS] for r in rows],
                     [r for r in rows if says_something(r)])


def _print_status(parts: Sequence[TablePart], fmt: Format | None, clear: bool) -> None:
    said = [r for part in parts for r in part.said]
    if clear and out.is_terminal:
        out.clear()
    if fmt is Format.tsv:
        for line in notices(said):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
        sys.stdout.write(tsv(TSV_FIELDS, [row for part in parts for row in part.cells]))
        sys.stdout.flush()
        return
    cells = cast(list[list[str]], [row for part in parts for row in part.cells])
    for line in notices(said):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    if pick_format(fmt, cells, STATUS_COLUMNS) is Format.plain:
        sys.stdout.write(plain_table(cells))
    else:
        table = Table(*STATUS_COLUMNS)
        table.columns[-1].overflow = "fold"  # the last error whole, folded, never cut
        for row in cells:
            table.add_row(*row)
        out.print(table)
    for line in footnotes(said):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    sys.stdout.flush()


# -- many tags: read and rendered in forked processes -----------------------------------------
#
# ``leafpool status`` of 100,000 tags is about 8 s of one core's CPU in one process (a third
# the replies' parsing by hiredis, a third status_from, a third the writing), and chunks of
# tags are independent. Each child reads its chunks on its own connection (redis-py makes a
# forked child's connections anew) and sends back what the parent writes: text, or the
# table's cells. Fewer tags than FORK_MIN_TAGS, one CPU, or no ``fork`` on the platform:
# read and rendered in this process, chunk by chunk.

T = TypeVar("T")

#: tags a chunk: read, rendered and sent back at once (100,000 tags' statuses at once held
#: 680 MB)
CHUNK = 5000
#: below this many tags the statuses are read in this process (forking a child costs tens
#: of milliseconds; 20,000 tags are about 1.5 s of CPU)
FORK_MIN_TAGS = 20_000


class _Job(Generic[T]):
    """What a child is given, inherited at the fork (nothing of it pickled): the pool, the
    tags, the time the rates are brought to and the rendering of a chunk's statuses."""

    def __init__(self, pool: Pool, names: Sequence[str], now_ms: float,
                 render: Callable[[list[TagStatus]], T]) -> None:
        self.pool, self.names, self.now_ms, self.render = pool, names, now_ms, render

    def chunk(self, lo: int) -> T:
        return self.render(pool_status(self.pool, list(self.names[lo:lo + CHUNK]), self.now_ms))


_job: _Job[Any] | None = None


def _in_child(lo: int) -> tuple[Any] | None:
    """The chunk at ``lo`` rendered, in a child; None when it failed (the parent reads that
    chunk itself, and raises its error as its own: an error pickled across the processes
    could lose its type or its fields)."""
    assert _job is not None
    try:
        return (_job.chunk(lo),)
    except Exception:
        return None


def _child_start() -> None:
    """In a child forked by :func:`rendered`, at once after the fork: it ends on SIGTERM
    (the pool's ``terminate``) and on Ctrl-C, whatever handlers the parent had installed
    (a flag-only handler inherited at the fork left ``terminate`` waiting on the child
    forever). Other forks of the process are left alone."""
    if _job is not None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_child_start)


def processes() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not on Linux)
        return os.cpu_count() or 1


def rendered(pool: Pool, names: Sequence[str], now_ms: float,
             render: Callable[[list[TagStatus]], T], workers: int | None = None
             ) -> Generator[T, None, None]:
    """``render`` of each chunk of :data:`CHUNK` tags' statuses (``names`` in their order),
    the rates brought to ``now_ms``, in order: from ``workers`` forked children (default:
    :func:`processes`) for :data:`FORK_MIN_TAGS` tags or more, else in this process. A
    chunk whose child failed is read again here, so its error is raised here; closing the
    iterator early ends the children."""
    global _job
    import multiprocessing  # here: the other commands start without it

    job = _Job(pool, names, now_ms, render)
    starts = range(0, len(names), CHUNK)
    n = processes() if workers is None else workers
    if (len(names) < FORK_MIN_TAGS or n < 2
            or "fork" not in multiprocessing.get_all_start_methods()):
        yield from map(job.chunk, starts)
        return
    _job = job
    try:
        with multiprocessing.get_context("fork").Pool(n) as children:
            for lo, part in zip(starts, children.imap(_in_child, starts), strict=True):
                yield job.chunk(lo) if part is None else part[0]
    finally:
        _job = None
