"""Generator identities: one Celery worker process is ``host:celery-node-name:index``.

An identity is stored raw where text is free (MySQL ``ip_port``, JSON data) and in its
*safe* form where it names a ZooKeeper node or a cache file (docs/design.md §8.1).
"""

from __future__ import annotations

import os
import re
import socket

from leafpool.core.errors import InvalidArgument

MAX_IDENTITY_LENGTH = 127  # leaf_workerid_alloc.ip_port is varchar(127)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@]")  # escaped in the safe form


def validate_identity(identity: object) -> str:
    if not isinstance(identity, str) or not identity.strip():
        raise InvalidArgument("identity", identity, "a non-empty string like host:node:index")
    if len(identity) > MAX_IDENTITY_LENGTH:
        why = f"is {len(identity)} characters long; at most {MAX_IDENTITY_LENGTH} are allowed"
        raise InvalidArgument("identity", identity, why)
    if any(ord(c) < 32 for c in identity):
        raise InvalidArgument("identity", identity, "must not contain control characters")
    return identity


def safe_identity(identity: str) -> str:
    """The identity as a ZooKeeper node name / file name component: ``A-Z a-z 0-9 _ . :
    @`` kept, every other byte of its UTF-8 as ``%XX`` (``-`` too: Leaf splits its
    ``forever`` children on it), so ``urllib.parse.unquote`` reverses it."""
    validate_identity(identity)
    safe = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), identity)
    return safe if safe not in {".", ".."} else safe.replace(".", "%2E")


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
