"""``leafpool status``: each tag's pool, as a table for a person or as rows for a script.

``--format``: ``table`` (rich's, for a terminal wide enough for it), ``plain`` (a header and
one line per tag, columns aligned, nothing wrapped or cut: the default when stdout is piped
or the terminal is narrower than the table), ``tsv`` (the same cells tab-separated, the
notices on stderr: for ``cut`` and ``awk``) and ``json`` (``--json``: the raw values).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from leafpool.cli_common import err, out, reports_errors, runtime
from leafpool.core.errors import UnknownTag
from leafpool.core.tags import validate_tag
from leafpool.status import (
    RICH_TABLE_ROWS,
    STATUS_COLUMNS,
    TagStatus,
    notices,
    plain_table,
    pool_status,
    status_detail,
    status_json,
    status_row,
)


class Format(StrEnum):
    table = "table"
    plain = "plain"
    tsv = "tsv"
    json = "json"


@reports_errors
def status(
    tags: Annotated[list[str] | None, typer.Argument(
        help="Only these tags, each in full: a field a line, nothing cut")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    fmt: Annotated[Format | None, typer.Option(
        "--format", help="table, plain (one line a tag), tsv or json; default: table in a "
                         "terminal wide enough for it, else plain")] = None,
    watch: Annotated[float, typer.Option(help="Refresh every N seconds (0: once)")] = 0.0,
) -> None:
    """Per tag: list length vs target, reserve, step, max_id, rate, seconds held at the
    peak and left at the rate now, last refill; the database and dry tags above."""
    rt = runtime()
    for tag in tags or []:
        validate_tag(tag)
    chosen = Format.json if as_json else fmt
    while True:
        with _collector_paused():
            rows = pool_status(rt.pool, tags)
            if tags and chosen is None:
                _print_details(rows, clear=bool(watch))
            else:
                _print_status(rows, chosen, clear=bool(watch))
        if not watch:
            return
        time.sleep(watch)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a status is read and printed: the
    half million objects of 10,000 tags' replies set off its full collections again and
    again (a fifth of the command's time); the replies hold no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _print_details(rows: list[TagStatus], clear: bool) -> None:
    if clear:
        out.clear()
    for row in rows:
        if row.mode == "?":
            raise UnknownTag(row.tag)
        sys.stdout.write(status_detail(row) + "\n")
    sys.stdout.flush()


def _tsv(rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "\t".join(" ".join(c.split()) for c in cells)
    return "".join(line(cells) + "\n" for cells in [list(STATUS_COLUMNS), *rows])


def _print_status(rows: list[TagStatus], fmt: Format | None, clear: bool) -> None:
    if fmt is Format.json:  # plain writes: rich's highlighting took seconds for 10,000 tags
        sys.stdout.write(status_json(rows))
        sys.stdout.flush()
        return
    cells = [status_row(r) for r in rows]
    if clear and out.is_terminal:
        out.clear()
    if fmt is Format.tsv:
        for line in notices(rows):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
        sys.stdout.write(_tsv(cells))
        sys.stdout.flush()
        return
    for line in notices(rows):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    text = plain_table(cells)
    if fmt is None:  # rich's table wraps each cell in a narrow terminal: plain rows there
        wide_enough = max(map(len, text.splitlines())) <= out.width
        fits = out.is_terminal and wide_enough and len(cells) <= RICH_TABLE_ROWS
        fmt = Format.table if fits else Format.plain
    if fmt is Format.plain:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    table = Table(*STATUS_COLUMNS)
    table.columns[-1].overflow = "fold"  # the last error whole, folded, never cut
    for row in cells:
        table.add_row(*row)
    out.print(table)
