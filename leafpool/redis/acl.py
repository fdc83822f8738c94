"""The Redis roles (docs/design.md §1.2): which commands each kind of user may send, on
which keys and channels, as Redis ACL rules (Redis 7.0: selectors). ``leafpool redis acl``
prints them as an ACL file; ``tests/redis/test_acl.py`` loads them into a real
redis-server and runs every part of leafpool under its role.

- ``app``: pops (``LPOP``, ``LPOP n``, ``BLPOP`` on ``P:*:ids``), and on an empty pool
  asks whether the tag exists (``SISMEMBER P:tags``), signals it (``SADD P:wanted``) and
  counts it (``HINCRBY P:*:hits``), and reads why (``HGET P:*:state``: whether the
  database is unreachable, for the error); ``WAIT`` and ``INFO`` for replica-acknowledged pops.
  Each command only on its own keys (one selector each): ``SADD`` cannot make a set of an
  empty ``ids`` list, ``HINCRBY`` cannot touch ``state``. Nothing it can send changes what
  a refiller reads: state, reserve, lock and high-water mark are out of its reach. The
  ``reserve`` empty-pool policy writes the reserve and the state: not for this role.
- ``worker``: the Celery worker and beat: every pool key, the broker's keys and channels
  (under its own prefix, kombu's ``global_keyprefix``), the drop watcher's tracking
  (``CLIENT TRACKING``, ``__redis__:invalidate``), the beat's presence channel
  (``P:beat:lock:*``, docs/design.md §3.1); no dangerous command but ``INFO``, ``ROLE``
  and the ``CLIENT`` subcommands it needs.
- ``monitor``: ``leafpool status``, ``/cache``, ``/metrics``, ``/api/status``: reads only.
- ``http``: the HTTP service: ``app`` and ``monitor`` together.
- ``admin``: the CLI (``tag add/step/remove``, ``refill``, ``pop``, ``status``): every
  pool key, no broker, no dangerous command.

The rules are data; they name keys under the settings' prefix and the broker's.
"""

from __future__ import annotations

import hashlib

from leafpool.core.errors import InvalidArgument

ROLES = ("app", "worker", "monitor", "http", "admin")

#: what every client sends on connecting (redis-py: AUTH, HELLO, SELECT) and its health
#: checks; redis-py's CLIENT SETINFO (Redis 7.2) is left out: redis-py goes on without it
_CONNECT = "+auth +hello +client|setname +select +ping +reset +quit"
_READS = ("+llen +lrange +lindex +hgetall +hmget +hget +exists +smembers +sismember +scard "
          "+srandmember +type +multi +exec +discard")
#: beyond -@dangerous, what the worker and the admin need: INFO (replication IDs, the lock
#: scripts), ROLE and CLIENT ID/TRACKING/INFO (the drop watcher)
_SAFE_DANGEROUS = "+info +role +client|id +client|tracking +client|info +client|getname"

#: The sentinels' own users (lines of each sentinel's config; Redis 7.0's Sentinel ACL):
#: leafpool's clients (the pools' Sentinel client, the broker's ``sentinel://``
#: transport; ``LEAFPOOL_REDIS_SENTINEL_USERNAME``) only ask which node is the master and
#: which replicas and sentinels it has: they cannot move the master (``FAILOVER``), change
#: what is watched (``SET``, ``MONITOR``, ``REMOVE``, ``RESET``, ``CONFIG``) or speak on
#: the sentinels' channel. redis-py's ``CLIENT SETINFO`` (Redis 7.2) is left out, as for
#: the data nodes.
SENTINEL_CLIENT_USER = "leafpool-sentinel-client"
SENTINEL_CLIENT_RULES = ("resetchannels -@all +auth +hello +ping +client|setname "
                         "+sentinel|get-master-addr-by-name +sentinel|masters "
                         "+sentinel|master +sentinel|slaves +sentinel|replicas "
                         "+sentinel|sentinels")
#: ... and the user each sentinel logs in to the others with (``sentinel sentinel-user``;
#: the same name as the user it logs in to the data nodes with): what a sentinel sends
#: another (its hello messages, PING, the vote on a master's failure), measured with an
#: ACL log on three sentinels through a failover, and ``SENTINEL DEBUG``, which sets the
#: periods ops/redis/sentinel.conf names once each sentinel has started.
SENTINEL_PEER_USER = "leafpool-sentinel"
SENTINEL_PEER_RULES = ("resetchannels &__sentinel__:hello -@all +auth +ping +client|setname "
                       "+publish +sentinel|is-master-down-by-addr +sentinel|debug")


def sentinel_user_line(user: str, rules: str, password: str) -> str:
    """One ``user`` line of a sentinel's config, the password as its SHA-256."""
    if not password:
        raise InvalidArgument("password", "", f"a non-empty password for {user}")
    return f"user {user} on #{hashlib.sha256(password.encode()).hexdigest()} {rules}"


def _app(prefix: str) -> list[str]:
    return [
        "resetkeys", "resetchannels", "-@all", _CONNECT, "+wait", "+info",
        f"(+lpop +blpop ~{prefix}:*:ids)",
        f"(+sismember ~{prefix}:tags)",
        f"(+sadd ~{prefix}:wanted)",
        f"(+hincrby ~{prefix}:*:hits)",
        f"(+hget ~{prefix}:*:state)",
    ]


def _monitor(prefix: str) -> list[str]:
    return ["resetkeys", "resetchannels", "-@all", _CONNECT, "+info", f"%R~{prefix}:*",
            _READS]


def broker_channels(broker_prefix: str, db: int) -> list[str]:
    """The broker's channels: every one under the prefix for SUBSCRIBE and PUBLISH, and
    the patterns Celery and Flower PSUBSCRIBE to, literally (Redis admits a PSUBSCRIBE
    only to a pattern the ACL names as it is: ``&P:*`` does not admit ``P:/0.celeryev/*``)."""
    base = f"{broker_prefix}:/{db}."
    return [f"&{broker_prefix}:*", f"&{base}celery.pidbox", f"&{base}celeryev/worker.*",
            f"&{base}celeryev/*"]


def rules(role: str, prefix: str = "leafpool", broker_prefix: str = "leafpool-broker",
          broker_db: int = 0) -> str:
    """The ACL rules of ``role`` (without the user name and password); ``broker_db``:
    the database number of the broker URL (it is part of the broker's channel names)."""
    if role == "app":
        parts = _app(prefix)
    elif role == "monitor":
        parts = _monitor(prefix)
    elif role == "http":  # the monitor's reads in the root, the app's selectors beside them
        parts = [*_monitor(prefix), "+wait", *_app(prefix)[6:]]
    elif role == "worker":
        parts = ["resetkeys", "resetchannels", f"~{prefix}:*", f"~{broker_prefix}:*",
                 *broker_channels(broker_prefix, broker_db), "&__redis__:invalidate",
                 f"&{prefix}:beat:lock:*", "+@all", "-@dangerous", _SAFE_DANGEROUS]
    elif role == "admin":
        parts = ["resetkeys", "resetchannels", f"~{prefix}:*", "+@all", "-@dangerous",
                 _SAFE_DANGEROUS]
    else:
        raise InvalidArgument("role", role, f"one of {', '.join(ROLES)}")
    return " ".join(parts)


def user_line(user: str, role: str, password: str, prefix: str = "leafpool",
              broker_prefix: str = "leafpool-broker", broker_db: int = 0) -> str:
    """One line of an ACL file: the user, on, its password as a SHA-256 (Redis never
    sees the password in the file), and its role's rules."""
    if not password:
        raise InvalidArgument("password", "", f"a non-empty password for {user}")
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {user} on #{digest} {rules(role, prefix, broker_prefix, broker_db)}"
