"""leafpool: distributed IDs from pre-generated Redis pools (Leaf-compatible)."""

from leafpool.client import AsyncClient, Client
from leafpool.errors import (
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

__version__ = "0.1.0"

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
]
