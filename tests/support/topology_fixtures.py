"""pytest fixtures for the replicated Redis topologies of ``tests/support/topologies.py``.

A test module using them declares ``pytest_plugins = ["tests.support.topology_fixtures"]`` (pytest
loads fixtures from conftest.py, the module's namespace and the plugins it names; the
plugin form needs no fixture imported under a name the test's arguments then shadow).

Every topology a test starts is stopped at its teardown (processes SIGKILLed, directories
removed), whatever the test did to it. A missing redis-server or redis-cli skips the test
with the reason, and fails it under ``CI=true`` (:func:`tests.support.services.missing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support import topologies as t
from tests.support.servers import NotInstalled
from tests.support.services import missing

__all__ = ["Topologies", "redis_cluster", "redis_replicated", "redis_sentinel_group",
           "topologies"]

T = TypeVar("T", bound=t.Topology)


class Topologies:
    """Starts topologies for one test (the arguments of :mod:`tests.support.topologies`' functions)
    and stops them all at its end."""

    def __init__(self) -> None:
        self.started: list[t.Topology] = []

    def _keep(self, start: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            top = start(*args, **kwargs)
        except NotInstalled as exc:
            missing(exc.what)
        self.started.append(top)
        return top

    def replicated(self, n_replicas: int = 1, config: Path | None = None,
                   appendfsync: str | None = None, **kwargs: Any) -> t.Replicated:
        return self._keep(t.replicated, n_replicas, config=config, appendfsync=appendfsync,
                          **kwargs)

    def sentinel_group(self, n_replicas: int = 2, n_sentinels: int = 3,
                       **kwargs: Any) -> t.SentinelGroup:
        return self._keep(t.sentinel_group, n_replicas, n_sentinels, **kwargs)

    def cluster(self, masters: int = 3, replicas_per_master: int = 1,
                **kwargs: Any) -> t.Cluster:
        return self._keep(t.cluster, masters, replicas_per_master, **kwargs)

    def stop(self) -> None:
        for top in self.started:
            top.stop()
        self.started.clear()


@pytest.fixture
def topologies() -> Iterator[Topologies]:
    """A factory for topologies with other settings than the fixtures below."""
    factory = Topologies()
    yield factory
    factory.stop()


@pytest.fixture
def redis_replicated(topologies: Topologies) -> t.Replicated:
    """A master and one replica, shipped config (appendfsync always), in sync."""
    return topologies.replicated(1)


@pytest.fixture
def redis_sentinel_group(topologies: Topologies) -> t.SentinelGroup:
    """A master, 2 replicas and 3 sentinels (quorum 2, master name ``leafpool``,
    down-after 1 s, failover-timeout 5 s), every sentinel aware of the whole group."""
    return topologies.sentinel_group(2, 3)


@pytest.fixture
def redis_cluster(topologies: Topologies) -> t.Cluster:
    """A Redis Cluster of 3 masters with one replica each (node timeout 1 s), state ok."""
    return topologies.cluster(3, 1)
