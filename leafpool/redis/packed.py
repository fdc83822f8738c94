"""Commands packed in the Redis protocol and replies read raw, for the reads and writes of
many tags at once (:mod:`leafpool.redis.pool_many`): what redis-py does per command, done
per chunk of commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

try:  # redis-py's hiredis parser (redis[hiredis]); read_replies falls back without it
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _HiredisParser
except ImportError:  # pragma: no cover
    _HiredisParser = None  # type: ignore[assignment,misc]
    _NOT_ENOUGH_DATA = None

from leafpool.core.keys import TagKeys


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """Commands in the Redis protocol (RESP arrays of bulk strings), as redis-py's
    ``pack_commands`` writes them for str, bytes and int arguments, at a fifth of its
    cost: 10,000 tags' snapshots are 40,000 commands, and most of their arguments (command
    and field names) repeat, so a string's encoding is looked up, not rebuilt."""
    out = bytearray()
    known = _encoded.get
    for command in commands:
        out += b"*%d\r\n" % len(command)
        for arg in command:
            # only str arguments are looked up: 1 and True are one dict key but not one
            # argument
            enc = known(arg) if type(arg) is str else None
            out += enc if enc is not None else _bulk(arg)
    return bytes(out)


def _bulk(arg: object) -> bytes:
    raw = arg if isinstance(arg, bytes) else str(arg).encode()
    enc = b"$%d\r\n%b\r\n" % (len(raw), raw)
    if type(arg) is str and len(_encoded) < _ENCODED_MAX:
        _encoded[arg] = enc
    return enc


def fresh_bulk(arg: object) -> bytes:
    raw = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%b\r\n" % (len(raw), raw)


def hash_dict(h: Any) -> dict[Any, Any]:
    """A hash read by ``HGETALL`` as a dict: RESP3 gives one, RESP2 a flat list of fields
    and values."""
    if isinstance(h, dict):
        return h
    pairs = iter(h)
    return dict(zip(pairs, pairs, strict=True))


#: tags whose keys a probe finds made of a fixed text before and after the tag's name
_PROBES = ("\x00", "probe-1.x_Y")


def around_tag(key: Callable[[TagKeys], str], tag: Callable[[str], TagKeys]
                ) -> tuple[str, str] | None:
    """The text before and after the tag's name in ``key``'s key names (``P:{`` and
    ``}:ids``), or None when the probes do not find the key made so."""
    before, found, after = key(tag(_PROBES[0])).partition(_PROBES[0])
    if not found or _PROBES[0] in after:
        return None
    if any(key(tag(t)) != before + t + after for t in _PROBES[1:]):
        return None
    return before, after


def read_replies(conn: Any, n: int) -> list[Any]:
    """``n`` replies read on ``conn``: what ``n`` calls of its ``read_response`` return, or
    raise. With redis-py's hiredis parser the replies are taken from hiredis's reader in
    one loop, the socket read when it has no whole reply: ``read_response``'s own checks
    around each reply were 40 % of reading 100,000 tags' statuses. A RESP3 push message
    goes to the parser's handler, as ``read_response`` does; an error reply is raised
    once all ``n`` are read (the connection left clean); a broken connection as redis-py
    raises it."""
    parser = getattr(conn, "_parser", None)
    if _HiredisParser is None or type(parser) is not _HiredisParser or parser._reader is None:
        return [conn.read_response() for _ in range(n)]
    gets: Any = parser._reader.gets
    fill: Any = parser.read_from_socket
    handle: Any = parser.handle_push_response
    push, short = parser._hiredis_PushNotificationType, _NOT_ENOUGH_DATA
    out: list[Any] = []
    add = out.append
    try:
        while n:
            reply = gets()
            if reply is short:
                fill()
            elif push is not None and type(reply) is push:
                handle(reply)
            else:
                add(reply)
                n -= 1
    except OSError as exc:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while reading from the socket: {exc.args}") from exc
    for reply in out:
        if isinstance(reply, Exception):
            raise reply
    return out


#: encodings of the first strings packed, kept: command and field names come first and
#: repeat in every tag's commands. Filled up to a bound and never evicted (an LRU cache
#: evicted them while 10,000 distinct key names went through it, and cost more than it
#: saved); a key name that gets in is only a wasted entry.
_ENCODED_MAX = 4096
_encoded: dict[str, bytes] = {}
