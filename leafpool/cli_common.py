"""What the CLI's commands share: the consoles, the error reporting (a leafpool error is
one red line and an exit code: 2 for bad input or configuration, 1 for the rest) and the
process's runtime."""

from __future__ import annotations

from collections.abc import Callable
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
