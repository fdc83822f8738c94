"""Redis key names: the public, documented layout (README, "Redis keys").

All keys of one tag share the hash tag ``{TAG}`` so they live in one Redis Cluster slot
and a Lua script may touch them together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TagKeys:
    """The keys of one tag."""

    prefix: str
    tag: str

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{name}"

    @property
    def ids(self) -> str:
        """List of ready IDs: the public interface, ``LPOP <ids> [count]``."""
        return self._key("ids")

    @property
    def reserve(self) -> str:
        """List of ``start:end`` ranges allocated from the database, not yet pushed."""
        return self._key("reserve")

    @property
    def state(self) -> str:
        """Hash: mode, step, targets, counters, high-water mark, last refill, errors."""
        return self._key("state")

    @property
    def hits(self) -> str:
        """Hash of what clients count (``empty_hits``, ``gaps``, ``lost_replies``,
        ``unacked_ids``): the one key of a tag an application writes, apart from the
        ``ids`` it pops (docs/design.md §1.2), so ``state`` is the refillers' alone."""
        return self._key("hits")

    @property
    def lock(self) -> str:
        """Refill lock: SET NX PX with a token, released by compare-and-delete."""
        return self._key("lock")

    @property
    def queued(self) -> str:
        """Short-lived marker: a refill task for this tag is already queued."""
        return self._key("queued")

    def all(self) -> list[str]:
        return [self.ids, self.reserve, self.state, self.lock, self.queued, self.hits]


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix."""

    prefix: str = "leafpool"

    def tag(self, tag: str) -> TagKeys:
        return TagKeys(self.prefix, tag)

    @property
    def tags(self) -> str:
        """Set of the tags known to the pool."""
        return f"{self.prefix}:tags"

    @property
    def wanted(self) -> str:
        """Set of tags a client found empty; the sweep turns them into refill tasks."""
        return f"{self.prefix}:wanted"

    @property
    def beat_lock(self) -> str:
        """Lock held by the one active beat scheduler."""
        return f"{self.prefix}:beat:lock"

    @property
    def sweep_lock(self) -> str:
        """Lock held by the running sweep, then while its full pass rests."""
        return f"{self.prefix}:sweep:lock"

    # -- from a key back to its tag (the drop watcher's invalidations) ------------------

    def tag_of(self, key: str) -> str | None:
        """The tag whose key ``key`` is (``prefix:{TAG}:name``), or None."""
        head = f"{self.prefix}:{{"
        if not key.startswith(head):
            return None
        end = key.find("}:", len(head))
        return key[len(head):end] if end > len(head) else None
