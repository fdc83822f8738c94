"""The Redis roles (docs/design.md §1.2): which commands each kind of user may send, on
which keys and channels, as Redis ACL rules (Redis 7.0: selectors). ``leafpool redis acl``
prints them as an ACL file; ``tests/redis/test_acl.py`` loads them into a real
redis-server and runs every part of leafpool under its role.

- ``app``: pops (``LPOP``, ``LPOP n``, ``BLPOP`` on ``P:*:ids``), and on an empty pool
  asks whether the tag exists (``SISMEMBER P:tags``), signals it (``SADD P:wanted``) and
  counts it (``HINCRBY P:*:hits``); ``WAIT`` and ``INFO`` for replica-acknowledged pops.
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


def _app(prefix: str) -> list[str]:
    return [
        "resetkeys", "resetchannels", "-@all", _CONNECT, "+wait", "+info",
        f"(+lpop +blpop ~{prefix}:*:ids)",
        f"(+sismember ~{prefix}:tags)",
        f"(+sadd ~{prefix}:wanted)",
        f"(+hincrby ~{prefix}:*:hits)",
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
