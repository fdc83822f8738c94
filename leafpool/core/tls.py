"""TLS to Redis: the certificate files of ``LEAFPOOL_REDIS_TLS_*``, checked once when the
settings load, and the options they become for redis-py (the pools) and for kombu (the
Celery broker).

TLS is chosen by the URL: ``rediss://`` in ``LEAFPOOL_REDIS_URL`` (for a Sentinel group:
the sentinels and the data nodes both speak TLS) or in ``LEAFPOOL_BROKER_URL``. The
server's certificate is always verified: against ``LEAFPOOL_REDIS_TLS_CA_FILE``, or the
system's CAs when it is unset, and its name against the host of the URL (or the address
Sentinel gives) unless ``LEAFPOOL_REDIS_TLS_CHECK_HOSTNAME=false``. Redis asks for a
client certificate by default (``tls-auth-clients yes``): ``LEAFPOOL_REDIS_TLS_CERT_FILE``
and ``LEAFPOOL_REDIS_TLS_KEY_FILE`` name it (both or neither).

Every file is read here, at start, with :mod:`ssl` itself: a missing file, a CA file
that holds no certificate or a key that does not match its certificate is refused naming
the variable, not found out at the first connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from leafpool.core.errors import ConfigurationError

CA_ENV = "LEAFPOOL_REDIS_TLS_CA_FILE"
CERT_ENV = "LEAFPOOL_REDIS_TLS_CERT_FILE"
KEY_ENV = "LEAFPOOL_REDIS_TLS_KEY_FILE"


@dataclass(frozen=True)
class RedisTls:
    """The TLS files (empty: not set) and the hostname check."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True

    @property
    def configured(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.key_file)

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


def _readable(env: str, path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(env, path, "a readable PEM file (there is no such file)")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise ConfigurationError(env, path, f"a readable PEM file ({exc.strerror})") from None


def check_tls(tls: RedisTls, tls_urls: bool) -> RedisTls:
    """Refuse files that cannot serve (``tls_urls``: some Redis URL is ``rediss://``)."""
    if not tls.configured:
        return tls
    if not tls_urls:
        env = CA_ENV if tls.ca_file else CERT_ENV if tls.cert_file else KEY_ENV
        raise ConfigurationError(
            env, getattr(tls, env.removeprefix("LEAFPOOL_REDIS_TLS_").lower()),
            "set only with a rediss:// URL (LEAFPOOL_REDIS_URL or LEAFPOOL_BROKER_URL): "
            "a redis:// URL does not use TLS")
    if bool(tls.cert_file) != bool(tls.key_file):
        env, other = (KEY_ENV, CERT_ENV) if tls.cert_file else (CERT_ENV, KEY_ENV)
        raise ConfigurationError(env, "", f"set together with {other}: the client "
                                 "certificate and its private key go together")
    context = ssl.create_default_context()
    if tls.ca_file:
        _readable(CA_ENV, tls.ca_file)
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                CA_ENV, tls.ca_file,
                f"a PEM file of CA certificates ({exc.reason or exc})") from None
    if tls.cert_file:
        _readable(CERT_ENV, tls.cert_file)
        _readable(KEY_ENV, tls.key_file)
        try:
            # an encrypted key is refused here, not prompted for on a terminal
            context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: b"")
        except ssl.SSLError as exc:
            raise ConfigurationError(
                KEY_ENV, tls.key_file,
                f"the unencrypted PEM private key of {CERT_ENV}={tls.cert_file} "
                f"({exc.reason or exc})") from None
    return tls
