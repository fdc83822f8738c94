"""Parsers of setting values: each takes the raw text of one ``LEAFPOOL_*`` variable and
returns the parsed form :class:`leafpool.core.config.Settings` keeps, or raises
:class:`~leafpool.core.errors.ConfigurationError` naming the variable (secrets hidden)."""

from __future__ import annotations

import hmac
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from leafpool.core.errors import ConfigurationError, InvalidInput
from leafpool.core.snowflake_layout import MAX_WORKER_ID
from leafpool.core.tags import validate_tag

LOCAL_MAP_ENV = "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"
TOKENS_ENV = "LEAFPOOL_HTTP_TOKENS"
REDIS_URL_ENV = "LEAFPOOL_REDIS_URL"
DATABASE_URL_ENV = "LEAFPOOL_DATABASE_URL"

#: supported segment-store URL schemes and the module each driver needs
DATABASE_DRIVERS = {
    "sqlite": "sqlite3",
    "sqlite+pysqlite": "sqlite3",
    "mysql+pymysql": "pymysql",  # a leafpool dependency
    "mysql": "MySQLdb",  # SQLAlchemy's default MySQL driver: mysqlclient, not installed by us
    "mysql+mysqldb": "MySQLdb",
}


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes "²", which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


_QUERY_SECRET = re.compile(r"(?i)((?:password|ssl_password|token)=)[^&;]*")


def hide_password(url: str) -> str:
    """``scheme://user:***@host/...``: a URL fit for a message, a log line or a page, the
    one masking function of leafpool. The user info is everything between ``://`` and the
    last ``@`` (a password may hold any character, ``/``, ``@`` and ``:`` included, even
    unencoded); a ``password=`` (or ``token=``) query value is masked too. A URL with an
    ``@`` after its host loses that part of the host as well: hiding too much, never a
    secret."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_SECRET.sub(r"\1***", url)
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***@{rest[at + 1:]}"
    return scheme + sep + _QUERY_SECRET.sub(r"\1***", rest)


def _host_part(url: str) -> tuple[str, str]:
    """(user info, host[:port]) of a URL: the user info is everything up to the last
    ``@`` before the query."""
    rest = url.partition("://")[2].split("?", 1)[0]
    at = rest.rfind("@")
    return (rest[:at] if at >= 0 else ""), rest[at + 1:].split("/", 1)[0]


def _check_host(env: str, url: str) -> None:
    """A port, when given, is a number from 1 to 65535; a password holding ``/``, ``?`` or
    ``#`` must be percent-encoded (``%2F``, ``%3F``, ``%23``), or the URL parsers take it
    for the path, the query or the fragment."""
    userinfo, host = _host_part(url)
    if any(c in userinfo for c in "/?#"):
        raise ConfigurationError(
            env, hide_password(url),
            "a URL whose password is percent-encoded: '/' is %2F, '?' %3F, '#' %23")
    port = host.rsplit("]", 1)[-1].rpartition(":")[2] if ":" in host.rsplit("]", 1)[-1] \
        else ""
    if port and not (_digits(port) and 1 <= int(port) <= 65535):
        raise ConfigurationError(
            env, hide_password(url), f"a port from 1 to 65535 after the host, not {port!r}")


# -- LEAFPOOL_SNOWFLAKE_NAME --------------------------------------------------------------

SNOWFLAKE_NAME_ENV = "LEAFPOOL_SNOWFLAKE_NAME"
_NAME = re.compile(r"[A-Za-z0-9_.@]+")


def validate_name(name: object) -> str:
    """``LEAFPOOL_SNOWFLAKE_NAME`` becomes a ZooKeeper path segment (the registries'
    root) and a directory name (the cache files')."""
    if not isinstance(name, str) or name in {".", ".."} or not _NAME.fullmatch(name):
        raise ConfigurationError(
            SNOWFLAKE_NAME_ENV, name, "a non-empty name from A-Z a-z 0-9 _ . @"
        )
    return name


# -- LEAFPOOL_SNOWFLAKE_LOCAL_MAP -----------------------------------------------------------

LocalMap = Mapping[str, int] | int | None


@lru_cache(maxsize=16)
def parse_local_map(value: str) -> LocalMap:
    """``LEAFPOOL_SNOWFLAKE_LOCAL_MAP``: ``{identity: worker_id}`` (read-only), an int for a
    bare number, None when empty (the lowest worker ID free on this host)."""
    text = value.strip()
    if not text:
        return None
    if _digits(text):
        return _map_worker_id(text, value)
    mapping: dict[str, int] = {}
    owners: dict[int, str] = {}
    for raw in text.replace("\n", ",").split(","):
        entry = raw.strip()
        if not entry:
            continue
        identity, sep, number = entry.rpartition("=")
        identity = identity.strip()
        if not sep or not identity:
            raise ConfigurationError(LOCAL_MAP_ENV, value,
                                     f"entry {entry!r} is not identity=worker_id")
        worker_id = _map_worker_id(number.strip(), value)
        if identity in mapping:
            raise ConfigurationError(LOCAL_MAP_ENV, value,
                                     f"identity {identity!r} is listed twice")
        if worker_id in owners:
            raise ConfigurationError(
                LOCAL_MAP_ENV, value,
                f"worker ID {worker_id} is given to both {owners[worker_id]!r} and "
                f"{identity!r}; they would generate duplicate IDs",
            )
        mapping[identity] = worker_id
        owners[worker_id] = identity
    if not mapping:
        raise ConfigurationError(LOCAL_MAP_ENV, value, "no identity=worker_id entry")
    return MappingProxyType(mapping)


def _map_worker_id(text: str, value: str) -> int:
    if not _digits(text) or int(text) > MAX_WORKER_ID:
        raise ConfigurationError(
            LOCAL_MAP_ENV, value,
            f"worker ID {text!r} is not an integer from 0 to {MAX_WORKER_ID}")
    return int(text)


# -- LEAFPOOL_HTTP_TOKENS ------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[!-~]+")  # printable ASCII, no spaces
_TOKEN_FORBIDDEN = set(";=,")


@dataclass(frozen=True)
class TokenPolicy:
    """``token -> allowed tags`` (``None``: every tag). Empty: auth is off."""

    grants: tuple[tuple[str, frozenset[str] | None], ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.grants)

    def lookup(self, token: str) -> tuple[bool, frozenset[str] | None]:
        """(known, allowed tags). Compares every token in constant time."""
        found: tuple[bool, frozenset[str] | None] = (False, frozenset())
        given = token.encode()
        for candidate, tags in self.grants:
            if hmac.compare_digest(candidate.encode(), given):
                found = (True, tags)
        return found


@lru_cache(maxsize=16)
def parse_tokens(value: str) -> TokenPolicy:
    """``LEAFPOOL_HTTP_TOKENS``: ``token=tag,tag;token=*``. A malformed value raises
    :class:`ConfigurationError` naming the variable and the entry (never the token)."""
    grants: list[tuple[str, frozenset[str] | None]] = []
    seen: set[str] = set()
    for number, raw in enumerate(value.split(";"), start=1):
        entry = raw.strip()
        if not entry:
            continue
        token, eq, tags_part = entry.partition("=")
        token = token.strip()
        shown = f"entry {number}: '<token>={tags_part.strip()}'"
        if not eq or not token:
            raise ConfigurationError(
                TOKENS_ENV, f"entry {number}",
                "entries look like 'token=tag1,tag2' or 'token=*', separated by ';'")
        if not _TOKEN_RE.fullmatch(token) or _TOKEN_FORBIDDEN & set(token):
            raise ConfigurationError(
                TOKENS_ENV, shown,
                "a token is printable ASCII without spaces, ';', '=' or ','")
        if token in seen:
            raise ConfigurationError(TOKENS_ENV, shown, "each token may appear once")
        seen.add(token)
        names = [t.strip() for t in tags_part.split(",")]
        if names == ["*"]:
            grants.append((token, None))
            continue
        if not names or any(not n for n in names):
            raise ConfigurationError(
                TOKENS_ENV, shown, "a comma-separated list of tags, or '*' for every tag")
        for name in names:
            try:
                validate_tag(name)
            except InvalidInput as exc:
                raise ConfigurationError(TOKENS_ENV, shown, f"tag {exc}") from exc
        grants.append((token, frozenset(names)))
    return TokenPolicy(tuple(grants))


# -- URLs -----------------------------------------------------------------------------------

def check_redis_url(url: str) -> str:
    from redis.connection import parse_url  # redis-py's own parser, as from_url uses it

    if "://" in url:
        _check_host(REDIS_URL_ENV, url)
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            REDIS_URL_ENV, hide_password(url),
            f"a Redis URL that redis-py accepts: {exc}") from None
    return url


def check_database_url(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    allowed = ", ".join(f"{s}://" for s in DATABASE_DRIVERS)
    if not sep or scheme not in DATABASE_DRIVERS:
        raise ConfigurationError(DATABASE_URL_ENV, hide_password(url),
                                 f"a SQLite or MySQL/MariaDB SQLAlchemy URL: {allowed}")
    if not scheme.startswith("sqlite"):
        first, _hosts = split_database_hosts(url)  # every host of a list checked
        _check_host(DATABASE_URL_ENV, first)
    module = DATABASE_DRIVERS[scheme]
    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(
            DATABASE_URL_ENV, hide_password(url),
            f"the driver of {scheme}:// (Python module {module}) is not installed; "
            "mysql+pymysql:// uses PyMySQL, which leafpool installs")
    return url


@dataclass(frozen=True)
class DatabaseHost:
    """One host of ``LEAFPOOL_DATABASE_URL``; ``port`` None: the driver's (3306)."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port is None else f"{name}:{self.port}"


_HOSTS_FORMAT = ("hosts as host:port,host:port (the port from 1 to 65535, or left out for "
                 "3306; an IPv6 address in brackets), each named once")


def split_database_hosts(url: str) -> tuple[str, tuple[DatabaseHost, ...]]:
    """A MySQL/MariaDB URL naming several hosts, ``mysql+pymysql://user:password@host1:3306,
    host2:3306,host3/database?options``, as (the same URL naming only the first host, which
    SQLAlchemy can parse; every host in order). A URL naming one host or none (SQLite):
    (``url``, ()). A malformed list raises :class:`ConfigurationError` naming
    ``LEAFPOOL_DATABASE_URL``. The user information is everything up to the last ``@``
    before the query, as for :func:`hide_password`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, ()
    before_query = rest.split("?", 1)[0]
    at = before_query.rfind("@") + 1
    netloc = rest[at:].split("/", 1)[0].split("?", 1)[0]
    if "," not in netloc:  # one host (or none): the URL is SQLAlchemy's as it is
        return url, ()
    hosts = [_database_host(entry.strip(), url) for entry in netloc.split(",")]
    if len(set(hosts)) != len(hosts):
        raise ConfigurationError(DATABASE_URL_ENV, hide_password(url), _HOSTS_FORMAT)
    first = f"{scheme}://{rest[:at]}{hosts[0]}{rest[at + len(netloc):]}"
    return first, tuple(hosts)


def _database_host(entry: str, url: str) -> DatabaseHost:
    if entry.startswith("["):
        host, bracket, tail = entry[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            host = ""
        port = tail[1:] if tail else None
    else:
        host, colon, text = entry.partition(":")
        port = text if colon else None
    if not host or any(c in host for c in "/?#@[] ") or (
            port is not None and not (_digits(port) and 1 <= int(port) <= 65535)):
        raise ConfigurationError(
            DATABASE_URL_ENV, hide_password(url),
            f"{_HOSTS_FORMAT}; {entry!r} is not host or host:port")
    return DatabaseHost(host, int(port) if port is not None else None)


# -- the Redis topology -----------------------------------------------------------------

SENTINELS_ENV = "LEAFPOOL_REDIS_SENTINELS"
POP_REPLICAS_ENV = "LEAFPOOL_POP_REPLICAS"
ALL_REPLICAS = "all"


@lru_cache(maxsize=16)
def parse_sentinels(value: str) -> tuple[tuple[str, int], ...]:
    """``LEAFPOOL_REDIS_SENTINELS``: ``host:port,host:port`` (empty: no Sentinel)."""
    out: list[tuple[str, int]] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not _digits(port) or not 1 <= int(port) <= 65535:
            raise ConfigurationError(SENTINELS_ENV, value,
                                     f"entry {entry!r} is not host:port (port 1 to 65535)")
        out.append((host.strip("[]"), int(port)))
    if value.strip() and not out:
        raise ConfigurationError(SENTINELS_ENV, value, "comma-separated host:port entries")
    return tuple(out)


def parse_pop_replicas(value: str) -> int | str:
    """``LEAFPOOL_POP_REPLICAS``: how many replicas must acknowledge a pop before its IDs
    are handed out: a number from 0 (no acknowledgement) to 16, or ``all`` (every replica
    the group knows when the process starts, down ones included: docs/design.md §7.1)."""
    text = value.strip().lower()
    if text == ALL_REPLICAS:
        return ALL_REPLICAS
    if not _digits(text) or int(text) > 16:
        raise ConfigurationError(POP_REPLICAS_ENV, value,
                                 "a number of replicas from 0 to 16, or 'all'")
    return int(text)
