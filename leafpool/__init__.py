"""leafpool: distributed IDs from pre-generated Redis pools (Leaf-compatible).

The package is a house of rooms, each a subpackage whose docstring says what it owns and
what it may import; a room imports only from the rooms below it (``pyproject.toml``'s
import-linter contracts and ``tests/test_architecture.py`` check it, type-only imports
included), from the ground up:

- :mod:`leafpool.core`: errors, key names, durations, tag names, settings, the snowflake
  ID layout;
- :mod:`leafpool.redis` and :mod:`leafpool.database`: the two boundaries (every Redis
  command on a pool key; engines, transactions and tables);
- :mod:`leafpool.refill`: the refill skeleton and the sizing rule both modes share;
- :mod:`leafpool.segment` and :mod:`leafpool.snowflake`: the two sources of IDs;
- :mod:`leafpool.housekeeping`: tag sync, sweep, drop watcher.

The modules at this top level are the surfaces, what users and operators touch:
:mod:`~leafpool.client` (``Client``, ``AsyncClient``), :mod:`~leafpool.cli` (with
:mod:`~leafpool.cli_common` and :mod:`~leafpool.cli_setup`), the HTTP service
(:mod:`leafpool.http`), :mod:`~leafpool.status`, :mod:`~leafpool.metrics` (with
:mod:`~leafpool.metric_families`), the embedded start (:mod:`~leafpool.embedded`,
:mod:`~leafpool.children`) and the wiring of a process (:mod:`~leafpool.runtime`).
``workers/`` (the only Celery code) sits above them.
"""

from typing import TYPE_CHECKING

from leafpool.core.errors import (
    BackendUnavailable,
    ClockMovedBackwards,
    ConfigurationError,
    InvalidArgument,
    InvalidInput,
    InvalidTag,
    LeafpoolError,
    PoolEmpty,
    SegmentExhausted,
    StaleWrite,
    UnknownTag,
    WorkerIdUnavailable,
)
from leafpool.core.version import __version__

if TYPE_CHECKING:
    from leafpool.client import AsyncClient, Client

__all__ = [
    "AsyncClient",
    "BackendUnavailable",
    "Client",
    "ClockMovedBackwards",
    "ConfigurationError",
    "InvalidArgument",
    "InvalidInput",
    "InvalidTag",
    "LeafpoolError",
    "PoolEmpty",
    "SegmentExhausted",
    "StaleWrite",
    "UnknownTag",
    "WorkerIdUnavailable",
    "__version__",
]


def __getattr__(name: str) -> object:
    """``Client`` and ``AsyncClient``, imported on first use (PEP 562): ``import
    leafpool.<module>`` (the CLI, a worker) does not pay for the client's imports."""
    if name in ("Client", "AsyncClient"):
        from leafpool import client

        value: object = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
