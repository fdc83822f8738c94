"""The pools' Redis commands on many tags at once: the tag sync, status, metrics, the
sweep and the drop watcher (docs/design.md §3.7, §4, §6). Part of the one Redis access
layer: :class:`leafpool.redis.pool.Pool` is built on this class; nothing else issues these
commands."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis

from leafpool.core.keys import Keys, TagKeys
from leafpool.redis.connect import is_cluster, redis_errors, wrap
from leafpool.redis.lock import replid_of, written_here
from leafpool.redis.packed import _ENCODED_MAX as _ENCODED_MAX  # pack's kept encodings
from leafpool.redis.packed import _encoded as _encoded  # (tests/housekeeping/test_sync.py)
from leafpool.redis.packed import around_tag, fresh_bulk, hash_dict, read_replies
from leafpool.redis.packed import pack as pack
from leafpool.redis.pool_common import (
    SNAPSHOT_REPLIES,
    Level,
    Snapshot,
    as_map,
    level_commands,
    level_from,
    snapshot_commands,
    snapshot_from,
    text,
)
from leafpool.redis.replicas import master_replid
from leafpool.redis.retries import safely

#: tags per pipeline of level reads (the sweep, the drop watcher's full pass)
LEVEL_CHUNK = 1000


def _on(conn: Any, commands: Sequence[tuple[str, ...]], what: str) -> list[Any]:
    """Send ``commands`` on one raw connection (pipelined) and read their replies."""
    try:
        conn.send_packed_command([pack(commands)])
        return [conn.read_response() for _ in commands]
    except redis.RedisError as exc:
        raise wrap(exc, what) from exc


#: tags per pipeline when many tags are read or written at once (status, metrics, sync)
TAGS_PER_PIPELINE = 500


#: one command on one of a tag's keys: its name, the key, the arguments after the key
TagRead = tuple[str, Callable[[TagKeys], str], tuple[str | int, ...]]


def _ids(k: TagKeys) -> str:
    return k.ids


def _reserve(k: TagKeys) -> str:
    return k.reserve


def _state(k: TagKeys) -> str:
    return k.state


def _lock(k: TagKeys) -> str:
    return k.lock


def _hits(k: TagKeys) -> str:
    return k.hits


class ManyTags:
    """Pipelined reads and writes of many tags (chunked: no one pipeline holds the
    commands of 10,000 tags)."""

    redis: Any
    keys: Keys

    def tag(self, tag: str) -> TagKeys:
        return self.keys.tag(tag)

    def snapshots(self, tags: Sequence[str]) -> list[Snapshot]:
        """Snapshots of many tags, pipelined in chunks of :data:`TAGS_PER_PIPELINE` (one
        round trip per chunk, not one transaction): each tag's four reads as plain
        commands. A script per tag (``snapshot.lua``, one reply instead of four) cost
        Redis 2.6x the CPU (111 ms against 42 ms for 10,000 tags) and saved the client
        nothing once the replies are read raw."""
        n = SNAPSHOT_REPLIES
        raw = self._pipelined("snapshots", tags, lambda tag: snapshot_commands(self.tag(tag)))
        return [
            snapshot_from(tag, (raw[i], raw[i + 1], as_map(raw[i + 2]), raw[i + 3],
                                raw[i + 4]))
            for tag, i in zip(tags, range(0, n * len(tags), n), strict=True)
        ]

    # -- many tags at once: the tag sync, status, metrics (docs/design.md §4, §6) ---------

    def _pipelined(self, what: str, tags: Sequence[str],
                   commands: Callable[[str], list[tuple[Any, ...]]]) -> list[Any]:
        """The raw replies of ``commands(tag)`` for every tag, in order, sent in chunks of
        :data:`TAGS_PER_PIPELINE` tags (no one pipeline holds the commands of 10,000
        tags). On one node (or a Sentinel's master) each chunk goes out on one connection
        as packed commands and is read back without redis-py's per-command pipeline
        machinery (half the client time of a 10,000-tag status); on a Cluster a pipeline
        splits each chunk by node. Replies are raw: a hash is a dict (RESP3) or a flat
        list (RESP2), see :func:`as_map`."""
        chunks = [[c for tag in tags[lo:lo + TAGS_PER_PIPELINE] for c in commands(tag)]
                  for lo in range(0, len(tags), TAGS_PER_PIPELINE)]
        with redis_errors(what):  # reads and idempotent writes: repeated after a lost reply
            return safely(lambda: self._send_chunks(chunks))

    def _send_chunks(self, chunks: list[list[tuple[Any, ...]]]) -> list[Any]:
        if is_cluster(self.redis):
            out: list[Any] = []
            for chunk in chunks:
                pipe: Any = self.redis.pipeline(transaction=False)
                for command in chunk:
                    pipe.execute_command(*command)
                out += pipe.execute()
            return out
        return self._send_packed((pack(chunk), len(chunk)) for chunk in chunks)

    def _send_packed(self, chunks: Iterable[tuple[bytes, int]]) -> list[Any]:
        """Send each chunk's packed commands on one connection of the pool and read its
        ``n`` replies (:func:`read_replies`), one chunk ahead: the next chunk is sent before
        a chunk's replies are read, so Redis runs it while this process reads (Redis buffers
        the replies; it never stops reading a client's commands for want of its reading)."""
        pool = self.redis.connection_pool
        conn: Any = pool.get_connection()
        out: list[Any] = []
        try:
            ahead = 0
            for packed, n in chunks:
                conn.send_packed_command([packed])
                if ahead:
                    out += read_replies(conn, ahead)
                ahead = n
            if ahead:
                out += read_replies(conn, ahead)
        except BaseException:
            conn.disconnect()  # replies may be left unread: never reuse it
            raise
        finally:
            pool.release(conn)
        return out

    def tag_reads(self, what: str, tags: Sequence[str], reads: Sequence[TagRead]) -> list[Any]:
        """The raw replies of ``reads`` (each a command on one of a tag's keys) for every
        tag, in order, :data:`TAGS_PER_PIPELINE` tags a round trip. What :meth:`_pipelined`
        does, with each command's bytes but the key's packed once for all tags (packing
        each tag's commands anew was a quarter of a 100,000-tag status's reads)."""
        if is_cluster(self.redis):
            return self._pipelined(what, tags, lambda tag: [
                (name, key(self.tag(tag)), *args) for name, key, args in reads])
        fixed = [(b"*%d\r\n" % (len(args) + 2) + fresh_bulk(name),
                  b"".join(fresh_bulk(a) for a in args), key) for name, key, args in reads]
        around = [around_tag(key, self.tag) for _, _, key in fixed]
        if all(around):
            return self._tag_reads_joined(what, tags, fixed, around)  # type: ignore[arg-type]

        def chunks() -> Iterator[tuple[bytes, int]]:
            for lo in range(0, len(tags), TAGS_PER_PIPELINE):
                parts: list[bytes] = []
                add = parts.append
                for tag in tags[lo:lo + TAGS_PER_PIPELINE]:
                    k = self.tag(tag)
                    for head, tail, key in fixed:
                        raw = key(k).encode()
                        add(head)
                        add(b"$%d\r\n%b\r\n" % (len(raw), raw))
                        add(tail)
                n = min(TAGS_PER_PIPELINE, len(tags) - lo) * len(fixed)
                yield b"".join(parts), n

        with redis_errors(what):  # reads only: repeated after a lost reply
            return safely(lambda: self._send_packed(chunks()))

    def _tag_reads_joined(self, what: str, tags: Sequence[str],
                          fixed: list[tuple[bytes, bytes, Callable[[TagKeys], str]]],
                          around: list[tuple[str, str]]) -> list[Any]:
        """:meth:`tag_reads` where every key is a fixed text, the tag's name, a fixed text
        (:func:`around_tag`): a tag's commands are the bytes between its name's places,
        the same for every name of a length (the keys' lengths in them), joined by the name
        in one call (a key formatted and packed at a time was a third of the reads)."""
        parts = [(head, before.encode(), after.encode(), tail)
                 for (head, tail, _), (before, after) in zip(fixed, around, strict=True)]
        by_length: dict[int, list[bytes]] = {}

        def between(length: int) -> list[bytes]:
            out, text = [], b""
            for head, before, after, tail in parts:
                out.append(text + head + b"$%d\r\n" % (len(before) + length + len(after))
                           + before)
                text = after + b"\r\n" + tail
            out.append(text)
            return by_length.setdefault(length, out)

        def chunks() -> Iterator[tuple[bytes, int]]:
            for lo in range(0, len(tags), TAGS_PER_PIPELINE):
                packed: list[bytes] = []
                add = packed.append
                for tag in tags[lo:lo + TAGS_PER_PIPELINE]:
                    raw = tag.encode()
                    add(raw.join(by_length.get(len(raw)) or between(len(raw))))
                n = min(TAGS_PER_PIPELINE, len(tags) - lo) * len(parts)
                yield b"".join(packed), n

        with redis_errors(what):  # reads only: repeated after a lost reply
            return safely(lambda: self._send_packed(chunks()))

    def status_reads(self, tags: Sequence[str], hit_fields: Sequence[str]
                     ) -> list[tuple[Any, Any, dict[Any, Any], Any, Any]]:
        """What a tag's status reads, raw, for every tag: the list's length, the reserve's
        ranges, its state (a dict of the hash's fields and values, bytes), whether its lock
        is held and ``hit_fields`` of its hits (values or None, in the fields' order): the
        commands of :func:`~leafpool.redis.pool_common.snapshot_commands`. The state is
        read whole (``HGETALL``): ``HMGET`` of the 42 fields a status shows halves this
        process's CPU but doubles Redis's (each field looked up, an absent one by a walk of
        the hash), and Redis's one thread serves every pop; the hits hash is small, so its
        4 fields are read by ``HMGET``."""
        raw = self.tag_reads("status", tags, [
            ("LLEN", _ids, ()), ("LRANGE", _reserve, (0, -1)),
            ("HGETALL", _state, ()), ("EXISTS", _lock, ()),
            ("HMGET", _hits, tuple(hit_fields))])
        states = [hash_dict(h) for h in raw[2::5]]
        return list(zip(raw[0::5], raw[1::5], states, raw[3::5], raw[4::5], strict=True))

    def register_many(self, entries: Sequence[tuple[str, str, int, Mapping[str, object]]]
                      ) -> list[bool]:
        """:meth:`register` for many ``(tag, mode, now_ms, fields)``, pipelined in chunks:
        the same commands in the same order for each tag. True for each tag that was new."""
        by_tag = {tag: (mode, now_ms, fields) for tag, mode, now_ms, fields in entries}

        def commands(tag: str) -> list[tuple[Any, ...]]:
            mode, now_ms, fields = by_tag[tag]
            state = self.tag(tag).state
            pairs = [x for name, value in fields.items() for x in (name, str(value))]
            # the state before the tag set, as Pool.register does
            return [("HSETNX", state, "mode", mode), ("HSETNX", state, "created_ms", now_ms),
                    # one reply more for every tag, fields or not: fixed-size replies
                    ("HSET", state, *pairs) if pairs else ("EXISTS", state),
                    ("SADD", self.keys.tags, tag)]

        raw = self._pipelined("register", [e[0] for e in entries], commands)
        return [bool(raw[4 * i + 3]) for i in range(len(entries))]

    def states(self, tags: Sequence[str], names: Sequence[str]) -> list[dict[str, str]]:
        """``HMGET`` of ``names`` in each tag's state, pipelined in chunks: what the tag
        sync needs of each tag without reading its lists (absent fields are left out)."""
        raw = self._pipelined("states", tags,
                              lambda tag: [("HMGET", self.tag(tag).state, *names)])
        return [{n: text(v) for n, v in zip(names, values, strict=True) if v is not None}
                for values in raw]

    def mark_queued_many(self, tags: Sequence[str], seconds: int) -> list[bool]:
        """Mark each tag queued unless a refill of it was marked in the last ``seconds``;
        True for the tags this call marked. ``SET NX GET`` with a token of this call: a
        repeat after a lost reply finds its own token (marked by us), where a plain
        ``SET NX`` would read "already queued" and the tag would wait out the marker
        with no refill queued."""
        token = secrets.token_hex(8)
        raw = self._pipelined("mark queued", tags, lambda tag: [
            ("SET", self.tag(tag).queued, token, "NX", "GET", "EX", seconds)])
        mine = token.encode()
        return [x is None or x == mine for x in raw]

    def keep_queued(self, tags: Sequence[str], seconds: int) -> None:
        """Set the ``queued`` marker of each tag that has one to expire in ``seconds``
        (``EXPIRE``: a tag without a marker gets none): a batch refill keeps the markers of
        the tags it has not reached short and alive while it runs (docs/design.md §3.7).
        Repeated after a lost reply: the same TTL again."""
        self._pipelined("keep queued", tags,
                        lambda tag: [("EXPIRE", self.tag(tag).queued, seconds)])

    def queued_ttls(self, tags: Sequence[str]) -> list[int]:
        """Milliseconds left of each tag's ``queued`` marker (``PTTL``: -2 none, -1 no
        expiry), in one round trip: when the drop watcher reads a held tag again."""
        return [int(x) for x in self._pipelined(
            "queued ttl", tags, lambda tag: [("PTTL", self.tag(tag).queued)])]

    # -- levels: the sweep and the drop watcher (docs/design.md §3.7) ----------------------

    def levels(self, tags: Sequence[str]) -> list[Level]:
        """Each tag's :class:`Level` (list length and four state fields): what the sweep
        reads instead of snapshots, two commands a tag, packed in chunks
        (:meth:`_pipelined`)."""
        raw = self._pipelined("levels", tags, lambda tag: level_commands(self.tag(tag)))
        return [level_from(tag, raw[2 * i:2 * i + 2]) for i, tag in enumerate(tags)]

    def locks_held(self, tags: Sequence[str]) -> list[bool]:
        """Whether a refill of each tag is running: its lock is held, and was taken on
        this master (:func:`~leafpool.redis.lock.written_here`). One round trip for the
        locks, and one ``INFO`` for each master holding a lock (one but on a Cluster)."""
        values = self._pipelined("locks", tags, lambda tag: [("GET", self.tag(tag).lock)])
        replids: dict[str, str] = {}  # a node's address -> its replication ID
        out = []
        for tag, value in zip(tags, values, strict=True):
            if value is None:
                out.append(False)
                continue
            key = self.tag(tag).lock
            node = self._node_name(key)
            if node not in replids:
                replids[node] = master_replid(self.redis, key)
            out.append(written_here(value, replids[node]))
        return out

    def _node_name(self, key: str) -> str:
        """Which master holds ``key``: its address on a Cluster, one name otherwise."""
        if is_cluster(self.redis):
            return str(self.redis.get_node_from_key(key).name)
        return ""

    def tracked_levels(self, conn: Any, tags: Sequence[str]) -> list[Level]:
        """:meth:`levels` with the lock, read on ``conn``: a connection of the drop watcher
        with client tracking on, so the next write to any key read here (a pop, a push,
        the lock taken or released) sends the watcher one invalidation. The master's
        replication ID is read with them (a lock written on a former master is not held:
        :func:`~leafpool.redis.lock.written_here`)."""
        out: list[Level] = []
        for lo in range(0, len(tags), LEVEL_CHUNK):
            chunk = tags[lo:lo + LEVEL_CHUNK]
            commands = [c for tag in chunk for c in level_commands(self.tag(tag), True)]
            info, *raw = _on(conn, [("INFO", "replication"), *commands], "tracked levels")
            replid = replid_of(info)
            out += [level_from(tag, raw[3 * i:3 * i + 3], replid) for i, tag in enumerate(chunk)]
        return out

    def tracked_tags(self, conn: Any) -> list[str]:
        """The pool's tags, read on the watcher's tracked connection (a tag added or
        removed sends an invalidation of the set)."""
        return sorted(text(t) for t in _on(conn, [("SMEMBERS", self.keys.tags)], "tags")[0])

    def tracked_wanted(self, conn: Any) -> int:
        """How many tags a client found empty, read on the tracked connection (the next
        ``SADD`` of a client sends an invalidation)."""
        return int(_on(conn, [("SCARD", self.keys.wanted)], "wanted")[0])
