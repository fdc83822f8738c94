"""What the CLI's commands share: the consoles, the error reporting (a leafpool error is
one red line and an exit code: 2 for bad input or configuration, 1 for the rest), the
process's runtime, and the one rule of the listing commands' ``--format`` (``leafpool
status``, ``leafpool tag list``): a table on a terminal, plain lines otherwise, tsv and
json for a script."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console

from leafpool.core.config import get_settings
from leafpool.core.errors import (
    ConfigurationError,
    InvalidInput,
    LeafpoolError,
    TagExists,
    UnknownTag,
)
from leafpool.runtime import Runtime
from leafpool.status import RICH_TABLE_ROWS, plain_table

out = Console()
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(fn: F) -> F:
    """Turn leafpool errors into one red line and an exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (InvalidInput, ConfigurationError, UnknownTag, TagExists) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False, markup=True)
            raise typer.Exit(2) from exc
        except LeafpoolError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from exc

    return wrapper  # type: ignore[return-value]


def runtime() -> Runtime:
    return Runtime(get_settings())


class Format(StrEnum):
    table = "table"
    plain = "plain"
    tsv = "tsv"
    json = "json"


FORMAT_HELP = ("table, plain (a line a row, columns aligned), tsv (plain values, for a "
               "script) or json; default: table on a terminal wide enough for it, else plain")


def pick_format(fmt: Format | None, rows: Sequence[Sequence[str]],
                columns: Sequence[str]) -> Format:
    """``fmt`` as asked; else rich's table where stdout is a terminal wide enough for the
    rows' plain lines (rich wraps each cell in a narrow one) and there are at most
    :data:`~leafpool.status.RICH_TABLE_ROWS` rows, plain lines anywhere else (a pipe, a
    file, a narrow terminal)."""
    if fmt is not None:
        return fmt
    if not out.is_terminal or len(rows) > RICH_TABLE_ROWS:
        return Format.plain
    wide_enough = max(map(len, plain_table(rows, columns).splitlines())) <= out.width
    return Format.table if wide_enough else Format.plain


def tsv_value(value: object) -> str:
    """One cell for a script: integers without separators, floats to 3 decimals without
    trailing zeros, nothing (None) as an empty cell, lists comma-joined, text on one
    line (no tab, no line break)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, list):
        return ",".join(map(str, value))
    return " ".join(str(value).split())


def tsv(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """The header, then a line a row, tab-separated."""
    return "".join("\t".join(map(tsv_value, line)) + "\n" for line in [header, *rows])
