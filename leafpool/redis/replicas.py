"""Replicas and failovers (docs/design.md §7): how many replicas a master reports, which
node holds a key, and the master's replication ID (it changes when a replica is promoted).

Redis replicates asynchronously: a pop the master acknowledged can be missing on the
replica a failover promotes, which then hands the same IDs out again. With
``LEAFPOOL_POP_REPLICAS`` set, every pop is followed by ``WAIT n ms`` in the same round
trip (:class:`leafpool.redis.pool.Pool`), and its IDs are handed out only when at least ``n``
replicas have it; otherwise they are dropped (a gap), never returned.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import RedisCluster

from leafpool.core.errors import ConfigurationError
from leafpool.core.setting_values import ALL_REPLICAS, POP_REPLICAS_ENV
from leafpool.redis.errors import wrap

log = logging.getLogger(__name__)


def _masters(client: Any) -> list[redis.Redis]:
    """Every master: the client itself, or each primary of a cluster."""
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]  # type: ignore[no-untyped-call]
    return [client]


def node_of(client: Any, key: str) -> redis.Redis:
    """The client of the node holding ``key`` (a WAIT must follow the pop on its node)."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(
            client.get_node_from_key(key))  # type: ignore[no-untyped-call]
    node: redis.Redis = client
    return node


def refresh(client: Any) -> None:
    """After an error on a cluster node: read the slot map again (a failover may have
    moved the key's slot to a promoted replica). Pops through a node's own client do not
    refresh the cluster client's map by themselves."""
    if isinstance(client, RedisCluster):
        try:
            client.nodes_manager.initialize()
        except redis.RedisError as exc:
            log.info("cluster: slot map not refreshed yet: %s", exc)


def connected_replicas(client: Any) -> int:
    """The fewest replicas any master reports connected."""
    try:
        return min(int(m.info("replication").get("connected_slaves", 0))
                   for m in _masters(client))
    except redis.RedisError as exc:
        raise wrap(exc, "INFO replication") from exc


def required(client: Any, wanted: int | str) -> int:
    """The number of acknowledgements a pop needs; refuses what the masters cannot give."""
    return 0 if wanted == 0 else need(wanted, connected_replicas(client))


def need(wanted: int | str, connected: int) -> int:
    """``wanted`` (a number or ``all``) against the replicas ``connected`` now."""
    need = connected if wanted == ALL_REPLICAS else int(wanted)
    if need > connected:
        raise ConfigurationError(
            POP_REPLICAS_ENV, wanted,
            f"at most the {connected} replica(s) the master reports connected now "
            "(INFO replication); add replicas or lower it")
    if need == 0:
        log.warning("pops: %s=all but the master has no replica: pops are not "
                    "acknowledged by any replica", POP_REPLICAS_ENV)
    return need


def replication_id(client: Any, key: str) -> tuple[str, str]:
    """(``master_replid``, ``host:port``) of the master holding ``key``, in one round trip
    (the address is the one the server sees this connection arrive on: CLIENT INFO)."""
    try:
        pipe = node_of(client, key).pipeline(transaction=False)
        pipe.info("replication")
        pipe.client_info()
        info, me = pipe.execute()
    except redis.RedisError as exc:
        raise wrap(exc, "INFO replication") from exc
    return str(info.get("master_replid", "")), str(me.get("laddr", "?"))


def log_discarded(tag: str, count: int, acked: int, required: int) -> None:
    log.warning("%s: %d ID(s) dropped: WAIT confirmed %d of %d replicas in time", tag, count,
                acked, required)
