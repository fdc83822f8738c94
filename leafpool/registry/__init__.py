"""Snowflake worker-ID registries (docs/design.md §8), chosen by
``LEAFPOOL_SNOWFLAKE_MODE``:

=============  ============================================================  ==========
mode           worker ID                                                     module
=============  ============================================================  ==========
``zk``         Leaf's persistent sequential node per identity, reused        ``zk``
``zk_recycle`` leased from 0..1023, reclaimed after the session expires      ``recycle``
``mysql``      NotFound9's ``leaf_workerid_alloc`` row, leased, recycled     ``mysql``
``local``      static map ``LEAFPOOL_SNOWFLAKE_LOCAL_MAP``                   ``local``
=============  ============================================================  ==========

All modes keep the local cache file (:mod:`.cache`) and refuse a start whose clock is
behind the recorded timestamp. Usage, one per generator process (after the fork)::

    registry = open_registry(settings, process_identity(node_name, index))
    gen = LeasedGenerator(registry, settings)
    gen.start()                 # claim
    ids = gen.next_batch(5000)  # safe to push
    gen.close()                 # release on shutdown
"""

from __future__ import annotations

from typing import Any

from leafpool.config import Settings
from leafpool.errors import ConfigurationError
from leafpool.registry.base import BaseRegistry, Lease, WorkerIdRegistry
from leafpool.registry.identity import (
    default_identity,
    process_identity,
    safe_identity,
    validate_identity,
)
from leafpool.registry.leased import LeasedGenerator

MODES = ("zk", "zk_recycle", "mysql", "local")


def open_registry(settings: Settings, identity: str, **kwargs: Any) -> BaseRegistry:
    """The registry of ``settings.snowflake_mode`` for ``identity`` (not claimed yet).

    ``kwargs`` go to the registry: ``clock``, ``sleep``, ``monotonic`` (tests),
    ``background=False`` (no report/renew thread), ``start_wait_ms``,
    ``connect_timeout_s`` (ZooKeeper modes), ``engine`` (mysql)."""
    validate_identity(identity)
    mode = settings.snowflake_mode
    if mode == "zk":
        from leafpool.registry.zk import ZkRegistry

        return ZkRegistry(settings, identity, **kwargs)
    if mode == "zk_recycle":
        from leafpool.registry.recycle import RecycleRegistry

        return RecycleRegistry(settings, identity, **kwargs)
    if mode == "mysql":
        from leafpool.registry.mysql import MySqlRegistry

        return MySqlRegistry(settings, identity, **kwargs)
    if mode == "local":
        from leafpool.registry.local import LocalRegistry

        return LocalRegistry(settings, identity, **kwargs)
    raise ConfigurationError("LEAFPOOL_SNOWFLAKE_MODE", mode, f"one of {', '.join(MODES)}")


__all__ = [
    "MODES",
    "BaseRegistry",
    "Lease",
    "LeasedGenerator",
    "WorkerIdRegistry",
    "default_identity",
    "open_registry",
    "process_identity",
    "safe_identity",
    "validate_identity",
]
