"""The client's commands on a tag's ready list (docs/design.md §7.2): ``LPOP``,
``LPOP n``, ``BLPOP``, the reserve take, each optionally followed by ``WAIT`` in the same
round trip (replica-acknowledged pops, §7.1).

None is ever repeated (:func:`~leafpool.redis.retries.send_once`): a pop whose reply was
lost may have taken IDs, and a repeat would take others. The IDs it may have taken are a
gap, counted in the tag's ``gaps`` (and the pop in ``lost_replies``); a pop that never
left (connecting or writing failed) took nothing and counts nothing. A pop whose IDs too
few replicas acknowledged is a gap too (``gaps`` and ``unacked_ids``).

What the counts cannot see: a pop whose reply was lost counts the IDs it asked for (it
may have taken fewer, from a list holding fewer), and the count itself is lost when Redis
stays unreachable; a plain ``LPOP`` of another client (another language) that loses its
reply is not counted by anyone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from leafpool.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    LeafpoolError,
    ReplicasBehind,
)
from leafpool.core.keys import Keys, TagKeys
from leafpool.redis import replicas
from leafpool.redis.connect import redis_errors, wrap
from leafpool.redis.pool_common import Range, ids_from, take_result
from leafpool.redis.retries import safely, send_once

log = logging.getLogger(__name__)

#: state counters of what a pop took and did not hand out (docs/design.md §7.2)
GAPS = "gaps"
LOST_REPLIES = "lost_replies"
UNACKED = "unacked_ids"


def gap_counts(ids: int, lost_reply: bool) -> dict[str, int]:
    """The counters a gap of ``ids`` IDs adds (and the lost reply, when that was it)."""
    return {GAPS: ids, LOST_REPLIES: 1} if lost_reply else {GAPS: ids}


def check_replies(replies: Sequence[Any], what: str) -> None:
    """Raise the first error reply (wrapped); MOVED, ASK and NOSCRIPT are the caller's."""
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise wrap(reply, what) from reply


MOVED, NOSCRIPT = "moved", "noscript"
SEND_ATTEMPTS = 3


def settle(replies: Sequence[Any], attempt: int, script: Any, what: str,
           refused: Callable[[Any], None] | None = None) -> str | None:
    """What a send's ``replies`` call for (:meth:`Pops._once` and its asyncio twin): to
    send again once the slot map (:data:`MOVED`: MOVED, ASK) or the script
    (:data:`NOSCRIPT`) is back, since nothing ran; or None, the replies are final
    (``refused`` sees each first; another error reply is raised)."""
    if attempt < SEND_ATTEMPTS - 1:
        if any(isinstance(r, redis.exceptions.MovedError | redis.exceptions.AskError)
               for r in replies):
            return MOVED
        if script is not None and any(isinstance(r, redis.exceptions.NoScriptError)
                                      for r in replies):
            return NOSCRIPT
    if refused is not None:
        for reply in replies:
            refused(reply)
    check_replies(replies, what)
    return None


def script_command(script: Any, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


#: a name no tag can have (a space: refused by core.tags), so its keys never exist and
#: the probe take writes nothing
RESERVE_PROBE_TAG = "reserve rights probe"
EMPTY_POLICY_ENV = "LEAFPOOL_EMPTY_POLICY"


def no_rights(reply: Any) -> None:
    """Raise ConfigurationError when ``reply`` is a refusal of the user's rights."""
    if isinstance(reply, redis.exceptions.NoPermissionError) or (
            isinstance(reply, redis.ResponseError) and "NOPERM" in str(reply)):
        raise ConfigurationError(
            EMPTY_POLICY_ENV, "reserve",
            "raise or wait for this Redis user: the reserve policy reads and writes the "
            "tag's reserve and state (take_reserve.lua), which the app role may not; run it "
            f"as the admin or worker role, or choose another policy (Redis said: {reply})")


def _load(node: Any, script: Any, tag: str) -> None:
    """Load ``script`` on ``node`` (its script cache was emptied: a restart, a failover)."""
    with redis_errors(f"{tag}: SCRIPT LOAD"):
        safely(lambda: node.script_load(script.script))


class Pops:
    """The client's pops, for :class:`~leafpool.redis.pool.Pool`."""

    redis: Any
    keys: Keys
    acks = 0  # replicas that must acknowledge a pop (LEAFPOOL_POP_REPLICAS; 0: none)
    ack_wait_ms = 100
    _behind = False  # the last acknowledged pop was refused: probe before popping again
    _take: Any
    _ids_keys: dict[str, str]

    def tag(self, tag: str) -> TagKeys:
        return self.keys.tag(tag)

    def _ids_key(self, tag: str) -> str:
        key = self._ids_keys.get(tag)
        if key is None:
            key = self._ids_keys[tag] = self.keys.tag(tag).ids
        return key

    # -- sending once -----------------------------------------------------------------------

    def _once(self, tag: str, key: str, commands: list[tuple[Any, ...]], what: str,
              at_stake: int, script: Any = None,
              refused: Callable[[Any], None] | None = None) -> list[Any]:
        """``commands`` on the node holding ``key``, never repeated once sent; ``at_stake``
        IDs are counted as a gap when the reply is lost. A command refused before it ran
        (MOVED, ASK: the slot moved; NOSCRIPT: the script cache was emptied) is sent again
        once the map or the script is back."""
        for attempt in range(SEND_ATTEMPTS):
            node = replicas.node_of(self.redis, key)
            lost = (lambda: self._count_gap(tag, at_stake, True)) if at_stake else None
            try:
                replies = send_once(node, commands, f"{tag}: {what}", lost)
            except BackendUnavailable:
                replicas.refresh(self.redis)
                raise
            resend = settle(replies, attempt, script, f"{tag}: {what}", refused)
            if resend == MOVED:
                replicas.refresh(self.redis)
            elif resend == NOSCRIPT:
                _load(node, script, tag)
            else:
                return replies
        raise AssertionError("unreachable")  # pragma: no cover

    def _count_gap(self, tag: str, ids: int, lost_reply: bool) -> None:
        """Count ``ids`` IDs taken and not handed out (best effort: with Redis unreachable
        the count is lost too, and said so in the log)."""
        if lost_reply:
            log.warning("%s: a pop's reply was lost: up to %d ID(s) counted as a gap, never "
                        "handed out", tag, ids)
        try:
            self._record_once(tag, gap_counts(ids, lost_reply))
        except LeafpoolError as exc:  # an overflowing counter too: counts are best effort
            log.warning("%s: gap of %d ID(s) not counted: %s", tag, ids, exc)

    def _record_once(self, tag: str, counts: dict[str, int]) -> None:
        """Add ``counts`` to the tag's ``hits`` (what clients count), never repeated (a
        repeat would count twice)."""
        hits = self.tag(tag).hits
        self._once(tag, hits, [("HINCRBY", hits, name, by) for name, by in counts.items()],
                   "count", 0)

    # -- pops -----------------------------------------------------------------------------

    def pop(self, tag: str) -> int | None:
        """``LPOP`` one ID (None when the list is empty): the hot path."""
        if self.acks:
            got = self.pop_many(tag, 1)
            return got[0] if got else None
        key = self._ids_keys.get(tag) or self._ids_key(tag)
        raw = self._once(tag, key, [("LPOP", key)], "LPOP", 1)[0]
        return None if raw is None else int(raw)

    def pop_many(self, tag: str, count: int) -> list[int]:
        """``LPOP key count``: up to ``count`` IDs, in order."""
        key = self._ids_keys.get(tag) or self._ids_key(tag)
        if self.acks:
            self._probe(tag, key)
            raw, acked = self._once(tag, key, [("LPOP", key, count), self._wait()], "LPOP",
                                    count)
            return self._acknowledged(tag, ids_from(raw), int(acked))
        return ids_from(self._once(tag, key, [("LPOP", key, count)], "LPOP", count)[0])

    def wait_pop(self, tag: str, timeout: float) -> int | None:
        """``BLPOP`` one ID, waiting up to ``timeout`` seconds for a refill."""
        key = self._ids_key(tag)
        command = ("BLPOP", key, f"{timeout:.3f}")
        if self.acks:
            self._probe(tag, key)
            popped, acked = self._once(tag, key, [command, self._wait()], "BLPOP", 1)
            got = self._acknowledged(tag, [] if popped is None else [int(popped[1])],
                                     int(acked))
            return got[0] if got else None
        popped = self._once(tag, key, [command], "BLPOP", 1)[0]
        return None if popped is None else int(popped[1])

    def take_reserve(self, tag: str, head: Range, count: int) -> list[int] | int:
        """Client path: take ``count`` IDs from the reserve head while the list is empty.
        Returns the IDs taken, or the script's refusal code (nothing written)."""
        k = self.tag(tag)
        count = min(count, head.size)
        take = script_command(self._take, [k.ids, k.reserve, k.state], head.take_args(count))
        if self.acks:
            self._probe(tag, k.ids)
            code, acked = self._once(tag, k.ids, [take, self._wait()], "take reserve", count,
                                     self._take)
            taken = take_result(head, count, int(code))
            if isinstance(taken, list):
                return self._acknowledged(tag, taken, int(acked))
            return taken
        code = self._once(tag, k.ids, [take], "take reserve", count, self._take)[0]
        return take_result(head, count, int(code))

    def check_reserve_rights(self) -> None:
        """The ``reserve`` policy takes IDs through ``take_reserve.lua``, which reads and
        writes the reserve and the state: a Redis user of the ``app`` role may not
        (docs/design.md §1.2). Asked once, at start, with a take that writes nothing (a
        probe tag with no reserve); a refusal of the user's rights raises
        :class:`ConfigurationError` naming ``LEAFPOOL_EMPTY_POLICY``."""
        k = self.tag(RESERVE_PROBE_TAG)
        take = script_command(self._take, [k.ids, k.reserve, k.state],
                              Range(1, 2).take_args(1))
        self._once(RESERVE_PROBE_TAG, k.ids, [take], "reserve rights", 0, self._take,
                   refused=no_rights)

    # -- replica-acknowledged pops (docs/design.md §7.1) ------------------------------------

    def _wait(self) -> tuple[Any, ...]:
        return ("WAIT", self.acks, self.ack_wait_ms)

    def require_replicas(self, required: int | str, wait_ms: int) -> int:
        """From now on hand out a pop's IDs only once ``required`` replicas (a number, or
        ``all``: every replica the group knows, down ones included) acknowledged it within
        ``wait_ms``; a requirement the group can never meet is refused here, not
        discovered pop by pop (:func:`replicas.need`)."""
        self.acks = safely(lambda: replicas.required(self.redis, required))
        self.ack_wait_ms = wait_ms
        return self.acks

    def _probe(self, tag: str, key: str) -> None:
        """After a refused pop, before the next: ``WAIT`` alone, which writes nothing and
        blocks until the replicas have this connection's last write or the wait ends; a
        pop now would only be dropped too while they are away, so nothing is popped and
        the pool is not drained into gaps (docs/design.md §7.1)."""
        if not self._behind:
            return
        started = time.monotonic()
        acked = int(self._once(tag, key, [self._wait()], "WAIT", 0)[0])
        if acked >= self.acks:
            self._behind = False
            return
        replicas.recheck_master(self.redis)
        # a WAIT on a connection that never wrote answers at once: pace the probes
        time.sleep(max(0.0, self.ack_wait_ms / 1000 - (time.monotonic() - started)))
        raise ReplicasBehind(tag, 0, acked, self.acks)

    def _acknowledged(self, tag: str, ids: list[int], acked: int) -> list[int]:
        if ids and acked < self.acks:
            replicas.log_discarded(tag, len(ids), acked, self.acks)
            with contextlib.suppress(LeafpoolError):
                self._record_once(tag, {UNACKED: len(ids), GAPS: len(ids)})
            self._behind = True
            replicas.recheck_master(self.redis)
            raise ReplicasBehind(tag, len(ids), acked, self.acks)
        return ids


__all__ = ["GAPS", "LOST_REPLIES", "UNACKED", "Pops", "gap_counts", "settle"]
