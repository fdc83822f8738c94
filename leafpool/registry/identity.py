"""Generator identities: one Celery worker process is ``host:celery-node-name:index``.

An identity is stored raw where text is free (MySQL ``ip_port``, JSON data) and in a
*safe* form where it names something: a ZooKeeper node (``/`` is a path separator, and
Leaf splits its ``forever`` children on ``-``) or a cache file. The safe form keeps
``A-Z a-z 0-9 _ . : @`` and writes every other byte of the UTF-8 encoding as ``%XX``, so
it is reversible and two identities never share a safe form.
"""

from __future__ import annotations

import os
import socket

from leafpool.errors import ConfigurationError, InvalidArgument

MAX_IDENTITY_LENGTH = 127  # leaf_workerid_alloc.ip_port is varchar(127)
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:@")


def validate_identity(identity: object) -> str:
    if not isinstance(identity, str) or not identity.strip():
        raise InvalidArgument("identity", identity, "a non-empty string like host:node:index")
    if len(identity) > MAX_IDENTITY_LENGTH:
        raise InvalidArgument(
            "identity", identity,
            f"is {len(identity)} characters long; at most {MAX_IDENTITY_LENGTH} are allowed",
        )
    if any(ord(c) < 32 for c in identity):
        raise InvalidArgument("identity", identity, "must not contain control characters")
    return identity


def safe_identity(identity: str) -> str:
    """The identity as a ZooKeeper node name / file name component (reversible)."""
    validate_identity(identity)
    out: list[str] = []
    for ch in identity:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    safe = "".join(out)
    return safe if safe not in {".", ".."} else safe.replace(".", "%2E")


def unsafe_identity(safe: str) -> str:
    """Inverse of :func:`safe_identity`."""
    raw = bytearray()
    i = 0
    while i < len(safe):
        if safe[i] == "%" and i + 2 < len(safe) and _is_hex(safe[i + 1:i + 3]):
            raw.append(int(safe[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(safe[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8")


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789ABCDEFabcdef" for c in text)


def split_identity(identity: str) -> tuple[str, str]:
    """``(host, rest)``: Leaf's Endpoint has ``ip`` and ``port``; we put the host and the
    rest of the identity (``node:index``) there."""
    host, _, rest = identity.partition(":")
    return host, rest


def process_identity(node_name: str, process_index: int, host: str | None = None) -> str:
    """The identity of one worker process: ``host:node_name:process_index``."""
    return validate_identity(f"{host or socket.gethostname()}:{node_name}:{process_index}")


def default_identity() -> str:
    """An identity for a process outside Celery: ``host:pid-PID:0``."""
    return process_identity(f"pid{os.getpid()}", 0)


def validate_name(name: object) -> str:
    """``snowflake_name`` becomes a ZooKeeper path segment and a directory name."""
    if not isinstance(name, str) or not name or any(c not in _SAFE or c == ":" for c in name) \
            or name in {".", ".."}:
        raise ConfigurationError(
            "LEAFPOOL_SNOWFLAKE_NAME", name, "a non-empty name from A-Z a-z 0-9 _ . @"
        )
    return name
