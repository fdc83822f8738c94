"""The logins leafpool presents to the shared services besides Redis's data nodes (whose
user and password are in ``LEAFPOOL_REDIS_URL``), checked when the settings load:

- the Redis sentinels' own (``LEAFPOOL_REDIS_SENTINEL_USERNAME`` and ``_PASSWORD``): an
  ACL user of the sentinels, or a password alone for a sentinel's ``requirepass``; sent
  by the pools' Sentinel client and the broker's ``sentinel://`` transport
  (``sentinel_kwargs``, redis-py's and kombu's);
- ZooKeeper's (``LEAFPOOL_ZK_USERNAME`` and ``_PASSWORD``): a digest identity; the
  registries of modes ``zk``, ``zk_recycle`` and ``k8s`` log in with it and create
  leafpool's nodes readable and writable by it alone (kazoo's ``auth_data`` and
  ``default_acl``).

They are settings of their own, not parts of a URL: a Sentinel list names several hosts
with one login, kombu takes a ``sentinel://`` URL's password for the master (not for the
sentinels), and ZooKeeper's connect string has no user part. A password is never shown:
its value in a message is ``***``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from leafpool.core.errors import ConfigurationError

SENTINEL_USERNAME_ENV = "LEAFPOOL_REDIS_SENTINEL_USERNAME"
SENTINEL_PASSWORD_ENV = "LEAFPOOL_REDIS_SENTINEL_PASSWORD"
ZK_USERNAME_ENV = "LEAFPOOL_ZK_USERNAME"
ZK_PASSWORD_ENV = "LEAFPOOL_ZK_PASSWORD"
HIDDEN = "***"

#: printable ASCII without spaces (a Redis ACL user name cannot hold one; ZooKeeper's
#: digest identity is ``user:password``, so its user has no colon either)
_NAME = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class Login:
    """A user name (may be empty: Redis's ``requirepass``) and a password (empty: no
    login); the password is left out of the repr."""

    username: str = ""
    password: str = field(default="", repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.password)

    def redis_options(self) -> dict[str, str]:
        """redis-py's ``username``/``password`` keyword arguments (none when not set)."""
        if not self.password:
            return {}
        return {**({"username": self.username} if self.username else {}),
                "password": self.password}

    def digest(self) -> str:
        """ZooKeeper's digest credential, ``user:password``."""
        return f"{self.username}:{self.password}"


def _check_name(env: str, name: str, no_colon: bool) -> None:
    if not _NAME.fullmatch(name) or (no_colon and ":" in name):
        allowed = "printable ASCII without spaces" + (" or ':'" if no_colon else "")
        raise ConfigurationError(env, name, f"a user name of {allowed}")


def sentinel_login(username: str, password: str, sentinel: bool) -> Login:
    """``LEAFPOOL_REDIS_SENTINEL_*``; ``sentinel``: a Sentinel group is configured
    (``LEAFPOOL_REDIS_SENTINELS`` or a ``sentinel://`` broker URL)."""
    if username and not password:
        raise ConfigurationError(SENTINEL_PASSWORD_ENV, "",
                                 f"set together with {SENTINEL_USERNAME_ENV}: the user's "
                                 "password (a user without one is not a login)")
    if username:
        _check_name(SENTINEL_USERNAME_ENV, username, no_colon=False)
    if password and not sentinel:
        raise ConfigurationError(
            SENTINEL_PASSWORD_ENV, HIDDEN, "set only with Sentinel (LEAFPOOL_REDIS_SENTINELS "
            "or a sentinel:// LEAFPOOL_BROKER_URL): the sentinels' own password")
    return Login(username, password)


def zk_login(username: str, password: str, zk_hosts: str) -> Login:
    """``LEAFPOOL_ZK_*``: both or neither, and only with ``LEAFPOOL_ZK_HOSTS``."""
    if not username and not password:
        return Login()
    if not username:
        raise ConfigurationError(ZK_USERNAME_ENV, "", f"set together with {ZK_PASSWORD_ENV}: "
                                 "ZooKeeper's digest identity is a user and a password")
    if not password:
        raise ConfigurationError(ZK_PASSWORD_ENV, "", f"set together with {ZK_USERNAME_ENV}: "
                                 "ZooKeeper's digest identity is a user and a password")
    _check_name(ZK_USERNAME_ENV, username, no_colon=True)
    if not zk_hosts.strip():
        raise ConfigurationError(ZK_USERNAME_ENV, username,
                                 "set only with LEAFPOOL_ZK_HOSTS (ZooKeeper's login)")
    return Login(username, password)
