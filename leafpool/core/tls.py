"""TLS files, checked once when the settings load: Redis's (``LEAFPOOL_REDIS_TLS_*``) and
the database's (``LEAFPOOL_DATABASE_TLS_*``), and the options they become for redis-py
(the pools), kombu (the Celery broker) and PyMySQL (the segment store and the snowflake
registry of mode ``mysql``).

Redis: TLS is chosen by the URL: ``rediss://`` in ``LEAFPOOL_REDIS_URL`` (for a Sentinel
group: the sentinels and the data nodes both speak TLS) or in ``LEAFPOOL_BROKER_URL``.
The database: ``LEAFPOOL_DATABASE_TLS=true`` (a MySQL URL has no TLS scheme). Either way
the server's certificate is always verified: against the CA file, or the system's CAs
when it is unset, and its name against the host of the URL (or the address Sentinel
gives) unless ``..._CHECK_HOSTNAME=false``. A client certificate (Redis asks for one by
default, ``tls-auth-clients yes``; a MySQL user ``REQUIRE X509``) is named by the
``..._CERT_FILE`` and ``..._KEY_FILE`` pair (both or neither).

Every file is read here, at start, with :mod:`ssl` itself: a missing file, a CA file
that holds no certificate or a key that does not match its certificate is refused naming
the variable, not found out at the first connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from leafpool.core.errors import ConfigurationError

REDIS_PREFIX = "LEAFPOOL_REDIS_TLS_"
DATABASE_PREFIX = "LEAFPOOL_DATABASE_TLS_"
DATABASE_TLS_ENV = "LEAFPOOL_DATABASE_TLS"
CA_ENV = f"{REDIS_PREFIX}CA_FILE"
CERT_ENV = f"{REDIS_PREFIX}CERT_FILE"
KEY_ENV = f"{REDIS_PREFIX}KEY_FILE"


@dataclass(frozen=True)
class TlsFiles:
    """The TLS files (empty: not set), the hostname check, and the prefix of the
    variables that set them (``LEAFPOOL_REDIS_TLS_`` or ``LEAFPOOL_DATABASE_TLS_``)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True
    prefix: str = REDIS_PREFIX

    @property
    def configured(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.key_file)

    def env(self, name: str) -> str:
        """The variable of ``name`` (``CA_FILE``, ``CERT_FILE``, ``KEY_FILE``)."""
        return f"{self.prefix}{name}"

    def redis_options(self) -> dict[str, object]:
        """redis-py's keyword arguments for a TLS connection (``ssl_*``)."""
        options: dict[str, object] = {"ssl_cert_reqs": "required",
                                      "ssl_check_hostname": self.check_hostname}
        if self.ca_file:
            options["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            options["ssl_certfile"] = self.cert_file
            options["ssl_keyfile"] = self.key_file
        return options

    def broker_options(self) -> dict[str, object]:
        """Celery's ``broker_use_ssl`` (kombu hands it to redis-py as it is); Celery wants
        ``ssl_cert_reqs`` as an :mod:`ssl` constant."""
        return {**self.redis_options(), "ssl_cert_reqs": ssl.CERT_REQUIRED}

    def context(self) -> ssl.SSLContext:
        """A client context: the server's certificate verified against the CA file (or the
        system's CAs), its name checked unless turned off, the client certificate loaded.
        PyMySQL takes it as its ``ssl`` argument as it is (given a dict without a CA, it
        would verify nothing)."""
        context = ssl.create_default_context(cafile=self.ca_file or None)
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        if self.cert_file:
            # an encrypted key is refused, not prompted for on a terminal
            context.load_cert_chain(self.cert_file, self.key_file, password=lambda: b"")
        return context


#: the Redis files (``LEAFPOOL_REDIS_TLS_*``): the name earlier releases gave the class
RedisTls = TlsFiles


def _readable(env: str, path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(env, path, "a readable PEM file (there is no such file)")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise ConfigurationError(env, path, f"a readable PEM file ({exc.strerror})") from None


def _first_set(tls: TlsFiles) -> tuple[str, str]:
    """The first file variable set, and its value."""
    for name, value in (("CA_FILE", tls.ca_file), ("CERT_FILE", tls.cert_file),
                        ("KEY_FILE", tls.key_file)):
        if value:
            return tls.env(name), value
    return tls.env("CA_FILE"), ""


def check_files(tls: TlsFiles) -> TlsFiles:
    """Refuse files that cannot serve: a certificate without its key (or the reverse), a
    file missing or unreadable, a CA file without a certificate, a key that does not match
    its certificate or is encrypted."""
    ca_env, cert_env, key_env = (tls.env(n) for n in ("CA_FILE", "CERT_FILE", "KEY_FILE"))
    if bool(tls.cert_file) != bool(tls.key_file):
        env, other = (key_env, cert_env) if tls.cert_file else (cert_env, key_env)
        raise ConfigurationError(env, "", f"set together with {other}: the client "
                                 "certificate and its private key go together")
    if tls.ca_file:
        _readable(ca_env, tls.ca_file)
    if tls.cert_file:
        _readable(cert_env, tls.cert_file)
        _readable(key_env, tls.key_file)
    try:
        tls.context()
    except ssl.SSLError as exc:
        if tls.ca_file:
            try:
                ssl.create_default_context(cafile=tls.ca_file)
            except ssl.SSLError as ca_exc:
                raise ConfigurationError(
                    ca_env, tls.ca_file,
                    f"a PEM file of CA certificates ({ca_exc.reason or ca_exc})") from None
        raise ConfigurationError(
            key_env, tls.key_file,
            f"the unencrypted PEM private key of {cert_env}={tls.cert_file} "
            f"({exc.reason or exc})") from None
    return tls


def check_tls(tls: TlsFiles, tls_urls: bool) -> TlsFiles:
    """Redis's files: refuse them without a ``rediss://`` URL (``tls_urls``: some Redis
    URL is one), then as :func:`check_files` does."""
    if not tls.configured:
        return tls
    if not tls_urls:
        env, value = _first_set(tls)
        raise ConfigurationError(
            env, value, "set only with a rediss:// URL (LEAFPOOL_REDIS_URL or "
            "LEAFPOOL_BROKER_URL): a redis:// URL does not use TLS")
    return check_files(tls)


def check_database_tls(tls: TlsFiles, enabled: bool, database_url: str) -> TlsFiles | None:
    """The database's TLS (``LEAFPOOL_DATABASE_TLS``): None when off. The files without
    it, TLS with SQLite, or TLS given both here and in the URL's query (SQLAlchemy's
    ``?ssl_ca=...``) are refused."""
    if not enabled:
        if tls.configured:
            env, value = _first_set(tls)
            raise ConfigurationError(env, value, f"set only with {DATABASE_TLS_ENV}=true")
        return None
    if not database_url.startswith("mysql"):
        raise ConfigurationError(DATABASE_TLS_ENV, "true",
                                 "true only with a MySQL/MariaDB LEAFPOOL_DATABASE_URL")
    query = database_url.partition("?")[2].lower()
    if any(part.startswith("ssl") for part in query.split("&")):
        raise ConfigurationError(
            DATABASE_TLS_ENV, "true", "TLS set once: in LEAFPOOL_DATABASE_TLS_* or in the "
            "URL's query (ssl_ca=...), not both")
    return check_files(tls)
