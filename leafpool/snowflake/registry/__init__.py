"""Snowflake worker-ID registries (docs/design.md §8), one module a mode of
``LEAFPOOL_SNOWFLAKE_MODE`` (:data:`REGISTRIES`). Usage, one per generator process
(after the fork)::

    registry = open_registry(settings, process_identity(node_name, index))
    gen = LeasedGenerator(registry, settings)
    gen.start()                 # claim
    ids = gen.next_batch(5000)  # safe to push
    gen.close()                 # release on shutdown
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, cast

from leafpool.core.config import Settings
from leafpool.core.errors import ConfigurationError
from leafpool.snowflake.registry.base import BaseRegistry, Lease
from leafpool.snowflake.registry.identity import (
    default_identity,
    process_identity,
    safe_identity,
    validate_identity,
)
from leafpool.snowflake.registry.leased import LeasedGenerator

#: mode -> (module, class), imported when the mode is opened
REGISTRIES = {
    "zk": ("zk", "ZkRegistry"),
    "zk_recycle": ("recycle", "RecycleRegistry"),
    "mysql": ("mysql", "MySqlRegistry"),
    "local": ("local", "LocalRegistry"),
    "k8s": ("k8s", "K8sRegistry"),
}
MODES = tuple(REGISTRIES)


def open_registry(settings: Settings, identity: str, **kwargs: Any) -> BaseRegistry:
    """The registry of ``settings.snowflake_mode`` for ``identity`` (not claimed yet).

    ``kwargs`` go to the registry: ``clock``, ``sleep``, ``monotonic`` (tests),
    ``background=False`` (no report/renew thread), ``start_wait_ms``,
    ``connect_timeout_s`` (ZooKeeper modes), ``engine`` (mysql), ``hostname`` (k8s)."""
    validate_identity(identity)
    mode = settings.snowflake_mode
    if mode not in REGISTRIES:
        raise ConfigurationError("LEAFPOOL_SNOWFLAKE_MODE", mode, f"one of {', '.join(MODES)}")
    module, name = REGISTRIES[mode]
    registry = getattr(import_module(f"leafpool.snowflake.registry.{module}"), name)
    return cast(type[BaseRegistry], registry)(settings, identity, **kwargs)


__all__ = [
    "MODES",
    "BaseRegistry",
    "Lease",
    "LeasedGenerator",
    "default_identity",
    "open_registry",
    "process_identity",
    "safe_identity",
    "validate_identity",
]
