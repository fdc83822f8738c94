"""redis-py's errors as leafpool's: :func:`wrap` is the one place a Redis error becomes a
:class:`~leafpool.core.errors.BackendUnavailable`, with a hint when the cause is a TLS
setting (OpenSSL's own words rarely say which setting to change)."""

from __future__ import annotations

import redis

from leafpool.core.errors import BackendUnavailable

#: (a fragment of redis-py's or OpenSSL's message, what to tell the operator)
_HINTS = (
    ("CERTIFICATE_VERIFY_FAILED", "TLS: the server's certificate is not trusted; "
     "LEAFPOOL_REDIS_TLS_CA_FILE must name the CA that signed it"),
    ("mismatch, certificate is not valid", "TLS: the server's certificate does not name "
     "this host (LEAFPOOL_REDIS_TLS_CHECK_HOSTNAME=false skips the check)"),
    ("EOF occurred in violation of protocol", "TLS: the server ended the handshake; a "
     "server that requires a client certificate needs LEAFPOOL_REDIS_TLS_CERT_FILE and "
     "LEAFPOOL_REDIS_TLS_KEY_FILE, signed by a CA it trusts"),
    ("alert certificate required", "TLS: the server requires a client certificate: "
     "LEAFPOOL_REDIS_TLS_CERT_FILE and LEAFPOOL_REDIS_TLS_KEY_FILE"),
    ("alert unknown ca", "TLS: the server does not trust the client certificate "
     "(LEAFPOOL_REDIS_TLS_CERT_FILE): it is not signed by a CA the server trusts"),
    ("Connection reset by peer", "a server that speaks TLS only resets a plain "
     "connection: is the URL rediss://?"),
    ("wrong version number", "TLS to a server that does not speak it: is the URL "
     "redis://?"),
)


def describe(exc: BaseException) -> str:
    """The error's message, with a hint when a TLS setting is the likely cause."""
    text = str(exc)
    for fragment, hint in _HINTS:
        if fragment in text:
            return f"{text} ({hint})"
    return text


def wrap(exc: redis.RedisError | OSError, what: str) -> BackendUnavailable:
    """The leafpool error for ``exc``; ``what`` names the tag and the command."""
    return BackendUnavailable(f"redis: {what}: {describe(exc)}")
