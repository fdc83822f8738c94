"""``leafpool status``: each tag's pool, as a table for a person or as rows for a script.

``--format`` (the rule of :func:`leafpool.cli_common.pick_format`, shared with ``leafpool
tag list``): ``table`` (rich's, for a terminal wide enough for it), ``plain`` (a header and
one line per tag, columns aligned, nothing wrapped or cut: the default when stdout is not a
terminal or the terminal is narrower than the table), ``tsv`` (:data:`TSV_FIELDS`: plain
values under the JSON's field names, the notices on stderr: for ``cut`` and ``awk``) and
``json`` (``--json``: every field, raw).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
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
from leafpool.core.collector import collector_paused as _collector_paused
from leafpool.core.errors import UnknownTag
from leafpool.core.tags import validate_tag
from leafpool.status import (
    STATUS_COLUMNS,
    TagStatus,
    footnotes,
    notices,
    plain_table,
    pool_status,
    status_detail,
    status_row,
)
from leafpool.status_json import status_json

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
            if chosen is Format.json:  # written as read, a chunk at a time
                now_ms = time.time() * 1000
                names = tags if tags is not None else rt.pool.tags()
                for part in status_json_parts(
                        pool_status(rt.pool, names[lo:lo + JSON_CHUNK], now_ms)
                        for lo in range(0, len(names), JSON_CHUNK)):
                    sys.stdout.write(part)
                sys.stdout.flush()
            elif tags and chosen is None:
                rows = pool_status(rt.pool, tags)
                _print_details(rows, clear=bool(watch))
            else:
                _print_status(pool_status(rt.pool, tags), chosen, clear=bool(watch))
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


def status_tsv(rows: Sequence[TagStatus]) -> str:
    """:data:`TSV_FIELDS`, a line a tag."""
    return tsv(TSV_FIELDS, [[getattr(r, name) for name in TSV_FIELDS] for r in rows])


#: tags a piece of ``--json`` output: read, written and let go (100,000 tags' statuses at
#: once held 680 MB, and the allocations cost a second of system CPU)
JSON_CHUNK = 5000


def status_json_parts(chunks: Iterable[Sequence[TagStatus]]) -> Iterator[str]:
    """:func:`~leafpool.status_json.status_json` of the chunks' statuses together, in pieces
    (plain writes: rich's highlighting took seconds for 10,000 tags)."""
    first = True
    for chunk in chunks:
        if chunk:
            body = status_json(chunk)[2:-3]  # without "[\n" and "\n]\n"
            yield ("[\n" if first else ",\n") + body
            first = False
    yield "[]\n" if first else "\n]\n"


def _print_status(rows: list[TagStatus], fmt: Format | None, clear: bool) -> None:
    if clear and out.is_terminal:
        out.clear()
    if fmt is Format.tsv:
        for line in notices(rows):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
        sys.stdout.write(status_tsv(rows))
        sys.stdout.flush()
        return
    cells = [status_row(r) for r in rows]
    for line in notices(rows):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    if pick_format(fmt, cells, STATUS_COLUMNS) is Format.plain:
        sys.stdout.write(plain_table(cells))
    else:
        table = Table(*STATUS_COLUMNS)
        table.columns[-1].overflow = "fold"  # the last error whole, folded, never cut
        for row in cells:
            table.add_row(*row)
        out.print(table)
    for line in footnotes(rows):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    sys.stdout.flush()
