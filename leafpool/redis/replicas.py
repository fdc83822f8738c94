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
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from leafpool.core.errors import BackendUnavailable, ConfigurationError
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
        raise wrap(exc, "the master reports connected") from exc


@dataclass(frozen=True)
class Group:
    """The replicas of the master (each master of a cluster: the fewest) as the group
    knows them: ``known`` counts those down or resynchronising too (any of them can be
    promoted once it answers again), ``connected`` those the master reports now."""

    known: int
    connected: int
    source: str  # where ``known`` was read

    def __post_init__(self) -> None:
        object.__setattr__(self, "known", max(self.known, self.connected))


def sentinel_of(client: Any) -> tuple[Any, str] | None:
    """(redis-py's ``Sentinel``, the master's name) behind a client from
    ``Sentinel.master_for`` (blocking or asyncio); None for any other client."""
    pool = getattr(client, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    return None if manager is None else (manager, str(pool.service_name))  # type: ignore[union-attr]


def known_by_sentinels(replies: list[Any]) -> int:
    """The replicas the sentinels know (``SENTINEL REPLICAS``, one reply per sentinel that
    answered; a sentinel remembers a replica while it is down): the most any reports."""
    lists = [r for r in replies if isinstance(r, list)]
    if not lists:
        raise BackendUnavailable("SENTINEL REPLICAS: no sentinel answered")
    return max(len(r) for r in lists)


def known_in_cluster(nodes: dict[str, Any]) -> int:
    """The fewest replicas any master serving slots has in ``CLUSTER NODES`` (as redis-py
    parses it), failed replicas included."""
    def flags(node: dict[str, Any]) -> set[str]:
        return set(str(node["flags"]).split(","))

    masters = {n["node_id"] for n in nodes.values()
               if "master" in flags(n) and n.get("slots") and "fail" not in flags(n)}
    counts = dict.fromkeys(masters, 0)
    for n in nodes.values():
        if n.get("master_id") in counts:
            counts[n["master_id"]] += 1
    return min(counts.values(), default=0)


def group(client: Any) -> Group:
    """What :func:`need` weighs, read from the sentinels, the cluster, or the master."""
    connected = connected_replicas(client)
    found = sentinel_of(client)
    try:
        if found is not None:
            manager, name = found
            replies: list[Any] = []
            for s in manager.sentinels:
                try:
                    replies.append(s.sentinel_slaves(name))
                except redis.RedisError as exc:
                    replies.append(exc)
            return Group(known_by_sentinels(replies), connected, "the sentinels know")
        if isinstance(client, RedisCluster):
            return Group(known_in_cluster(client.cluster_nodes()), connected,
                         "CLUSTER NODES lists for a master")
    except redis.RedisError as exc:
        raise wrap(exc, "the replicas") from exc
    return Group(connected, connected, "the master reports connected")


def recheck_master(client: Any) -> None:
    """After a pop too few replicas acknowledged: ask the sentinels which node is the
    master now (a Sentinel client; nothing otherwise). A client still connected to a
    former master that came back after a failover finds no replica there; redis-py closes
    the connections to it when the sentinels name another node, and the next pop goes to
    the new master (docs/design.md §7.1)."""
    pool = getattr(client, "connection_pool", None)
    if sentinel_of(client) is not None:
        try:
            pool.get_master_address()  # type: ignore[union-attr]
        except redis.RedisError as exc:
            log.info("pops: the sentinels did not name a master: %s", exc)


async def recheck_master_async(client: Any) -> None:
    """The asyncio twin of :func:`recheck_master`."""
    pool = getattr(client, "connection_pool", None)
    if sentinel_of(client) is not None:
        try:
            await pool.get_master_address()  # type: ignore[union-attr]
        except redis.RedisError as exc:
            log.info("pops: the sentinels did not name a master: %s", exc)


def required(client: Any, wanted: int | str) -> int:
    """The number of acknowledgements a pop needs; refuses what the group cannot give."""
    return 0 if wanted == 0 else need(wanted, group(client))


def need(wanted: int | str, replicas: Group) -> int:
    """``wanted`` (a number or ``all``) against the group's replicas (docs/design.md
    §7.1): a pop is safe from any promotion only when every replica that can be promoted
    acknowledged it, so ``all`` is every replica the group knows, down ones included
    (not those connected now), and a smaller number is allowed but warned about. A
    replica down or resynchronising now makes pops wait for it (refused meanwhile, never
    handed out unacknowledged)."""
    need = replicas.known if wanted == ALL_REPLICAS else int(wanted)
    if need > replicas.known:
        raise ConfigurationError(
            POP_REPLICAS_ENV, wanted,
            f"at most the {replicas.known} replica(s) {replicas.source} "
            "(add replicas or lower it)")
    if need == 0:
        log.warning("pops: %s=all but the master has no replica: pops are not "
                    "acknowledged by any replica", POP_REPLICAS_ENV)
    elif need < replicas.known:
        log.warning(
            "pops: %s=%s of the %d replicas %s: a replica that did not acknowledge a pop "
            "can be promoted after a sequence of failures and hand its IDs out again; set "
            "%s=all (docs/design.md 7.1)", POP_REPLICAS_ENV, wanted, replicas.known,
            replicas.source, POP_REPLICAS_ENV)
    if replicas.connected < need:
        log.warning("pops: %d of the %d replica(s) a pop needs are connected now: pops are "
                    "refused (ReplicasBehind) until the others are back and in sync",
                    replicas.connected, need)
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
        raise wrap(exc, "the master reports connected") from exc
    return str(info.get("master_replid", "")), str(me.get("laddr", "?"))


def master_replid(client: Any, key: str) -> str:
    """``master_replid`` of the master holding ``key`` (INFO replication)."""
    try:
        info = node_of(client, key).info("replication")
    except redis.RedisError as exc:
        raise wrap(exc, "the master's replication ID") from exc
    return str(info.get("master_replid", ""))


def log_discarded(tag: str, count: int, acked: int, required: int) -> None:
    log.warning("%s: %d ID(s) dropped: WAIT confirmed %d of %d replicas in time", tag, count,
                acked, required)
