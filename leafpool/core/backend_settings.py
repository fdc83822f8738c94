"""The settings that say where each backend is and how to reach it (the database, the
pools' Redis and its topology, the Celery broker, ZooKeeper) with their TLS files and
logins: the base of :class:`leafpool.core.config.Settings`, which reads and validates
them with the rest (:meth:`BackendSettings._check_backends` runs from its validator).

What is checked here: the database URL names a supported database whose driver is
installed; Sentinel and Cluster are not both chosen; a Cluster has a broker of its own;
the TLS files (:mod:`leafpool.core.tls`) and the logins
(:mod:`leafpool.core.credentials`) fit the URLs they serve.
"""

from __future__ import annotations

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from leafpool.core.credentials import Login, sentinel_login, zk_login
from leafpool.core.errors import ConfigurationError
from leafpool.core.setting_values import (
    SENTINELS_ENV,
    check_database_url,
    check_redis_url,
    parse_sentinels,
)
from leafpool.core.tls import DATABASE_PREFIX, TlsFiles, check_database_tls, check_tls

#: the broker's connections to the sentinels (a sentinel answers in milliseconds)
SENTINEL_TIMEOUTS = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


class BackendSettings(BaseSettings):
    """Where the backends are and how to log in to them. Field ``foo`` is read from
    ``LEAFPOOL_FOO``."""

    model_config = SettingsConfigDict(env_prefix="LEAFPOOL_", extra="ignore", frozen=True,
                                      allow_inf_nan=False)

    database_url: str = ""
    # TLS to MySQL/MariaDB (leafpool/core/tls.py): on, the server's certificate verified
    # against the CA file (default: the system's) and its name; a client certificate
    database_tls: bool = False
    database_tls_ca_file: str = ""
    database_tls_cert_file: str = ""
    database_tls_key_file: str = ""
    database_tls_check_hostname: bool = True
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str = ""

    # Redis topology (docs/design.md §7): one node (LEAFPOOL_REDIS_URL), a Sentinel group
    # (LEAFPOOL_REDIS_SENTINELS, LEAFPOOL_REDIS_MASTER_NAME; the URL gives the database
    # number and password), or a Cluster (LEAFPOOL_REDIS_CLUSTER, the URL names any node)
    redis_sentinels: str = ""
    redis_master_name: str = "leafpool"
    redis_cluster: bool = False
    # the sentinels' own login (leafpool/core/credentials.py): an ACL user and its
    # password, or a password alone (requirepass); the pools' and the broker's clients
    redis_sentinel_username: str = ""
    redis_sentinel_password: SecretStr = SecretStr("")
    # TLS (rediss:// URLs; leafpool/core/tls.py): the CA that signed the servers'
    # certificates (default: the system's), the client certificate and key (mutual TLS)
    redis_tls_ca_file: str = ""
    redis_tls_cert_file: str = ""
    redis_tls_key_file: str = ""
    redis_tls_check_hostname: bool = True

    # ZooKeeper (snowflake modes zk, zk_recycle, k8s) and its digest login: leafpool's
    # nodes are then readable and writable by that identity alone (ACLs)
    zk_hosts: str = ""
    zk_username: str = ""
    zk_password: SecretStr = SecretStr("")

    # The validators raise ConfigurationError themselves (pydantic passes it on
    # unchanged): their messages name the variable and hide secrets.

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        return check_redis_url(value)

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str) -> str:
        parse_sentinels(value)
        return value

    def _check_backends(self) -> None:
        """What depends on several of these settings (after the database URL's default
        is filled in); fills in the broker's default."""
        check_database_url(self.database_url)
        if self.redis_sentinels and self.redis_cluster:
            raise ConfigurationError(
                SENTINELS_ENV, self.redis_sentinels,
                "not with LEAFPOOL_REDIS_CLUSTER=true: choose Sentinel or Cluster")
        if not self.broker_url and self.redis_cluster:
            raise ConfigurationError(
                "LEAFPOOL_BROKER_URL", "",
                "required with LEAFPOOL_REDIS_CLUSTER=true: Celery's Redis transport cannot "
                "use a Redis Cluster; name a separate Redis (redis://...) or Sentinel group "
                "(sentinel://host:port;sentinel://host:port)")
        if not self.broker_url:
            object.__setattr__(self, "broker_url", self._default_broker())
        check_tls(self.redis_tls, self.pools_tls or self.broker_url.startswith("rediss://"))
        check_database_tls(self.database_tls_files, self.database_tls, self.database_url)
        _ = self.sentinel_login, self.zk_login  # each raises on a bad value

    # -- parsed forms (validated at load) --------------------------------------------------

    def _default_broker(self) -> str:
        """The pools' Redis: with Sentinel, kombu's sentinel transport over the same
        sentinels (its master name is a transport option, see :attr:`broker_options`)."""
        if not self.redis_sentinels:
            return self.redis_url
        db = self.redis_url.rsplit("/", 1)[-1] if self.redis_url.count("/") >= 3 else "0"
        return ";".join(f"sentinel://{h}:{p}/{db or 0}" for h, p in self.sentinels)

    @property
    def sentinels(self) -> tuple[tuple[str, int], ...]:
        """``LEAFPOOL_REDIS_SENTINELS`` parsed."""
        return parse_sentinels(self.redis_sentinels)

    @property
    def redis_topology(self) -> str:
        """``single``, ``sentinel`` or ``cluster``."""
        if self.redis_cluster:
            return "cluster"
        return "sentinel" if self.redis_sentinels else "single"

    @property
    def redis_tls(self) -> TlsFiles:
        """``LEAFPOOL_REDIS_TLS_*`` (checked at load, see :mod:`leafpool.core.tls`)."""
        return TlsFiles(self.redis_tls_ca_file, self.redis_tls_cert_file,
                        self.redis_tls_key_file, self.redis_tls_check_hostname)

    @property
    def database_tls_files(self) -> TlsFiles:
        """``LEAFPOOL_DATABASE_TLS_*`` (checked at load; in use with
        ``LEAFPOOL_DATABASE_TLS=true`` only, see :attr:`database_tls_used`)."""
        return TlsFiles(self.database_tls_ca_file, self.database_tls_cert_file,
                        self.database_tls_key_file, self.database_tls_check_hostname,
                        DATABASE_PREFIX)

    @property
    def database_tls_used(self) -> TlsFiles | None:
        """The database's TLS files when ``LEAFPOOL_DATABASE_TLS=true``, else None."""
        return self.database_tls_files if self.database_tls else None

    @property
    def sentinel_login(self) -> Login:
        """``LEAFPOOL_REDIS_SENTINEL_USERNAME``/``_PASSWORD``."""
        return sentinel_login(self.redis_sentinel_username,
                              self.redis_sentinel_password.get_secret_value(),
                              bool(self.redis_sentinels)
                              or self.broker_url.startswith("sentinel://"))

    @property
    def zk_login(self) -> Login:
        """``LEAFPOOL_ZK_USERNAME``/``_PASSWORD`` (no login when unset)."""
        return zk_login(self.zk_username, self.zk_password.get_secret_value(), self.zk_hosts)

    @property
    def pools_tls(self) -> bool:
        """The pools' Redis speaks TLS (a ``rediss://`` LEAFPOOL_REDIS_URL; with Sentinel,
        the sentinels too)."""
        return self.redis_url.startswith("rediss://")

    @property
    def broker_tls(self) -> bool:
        """The broker speaks TLS: a ``rediss://`` broker URL, or the default Sentinel
        broker over the sentinels of a ``rediss://`` LEAFPOOL_REDIS_URL."""
        return self.broker_url.startswith("rediss://") or (
            self.broker_url.startswith("sentinel://") and self.pools_tls)

    @property
    def broker_use_ssl(self) -> dict[str, object] | None:
        """Celery's ``broker_use_ssl``: None for a broker without TLS."""
        return self.redis_tls.broker_options() if self.broker_tls else None

    @property
    def broker_options(self) -> dict[str, object]:
        """Extra kombu transport options the broker URL needs: Sentinel's master name, and
        the sentinels' own TLS and login (``sentinel_kwargs``: kombu hands them to
        redis-py's Sentinel for its connections to the sentinels, while the URL's user and
        password go to the master)."""
        if not self.broker_url.startswith("sentinel://"):
            return {}
        options: dict[str, object] = {"master_name": self.redis_master_name}
        tls = {"ssl": True, **self.redis_tls.redis_options()} if self.broker_tls else {}
        if tls or self.sentinel_login.configured:
            # given sentinel_kwargs, redis-py no longer copies the socket timeouts into
            # them: a sentinel that stopped answering would hold the worker for good
            options["sentinel_kwargs"] = {**SENTINEL_TIMEOUTS, **tls,
                                          **self.sentinel_login.redis_options()}
        return options
