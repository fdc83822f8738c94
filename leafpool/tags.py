"""Tags: the one place that says what a valid ``biz_tag`` is, and the one place a tag
of the database is registered with the pool.

Allowed: 1 to 128 characters (Leaf's ``biz_tag varchar(128)``) from ``A-Z a-z 0-9 _ . -``.
Braces, colons and spaces are refused because they would break the Redis key layout
(``leafpool:{TAG}:ids`` uses the tag as a Redis Cluster hash tag).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from leafpool.errors import InvalidTag

if TYPE_CHECKING:
    from leafpool.pool import Pool

MAX_TAG_LENGTH = 128
TAG_CHARS = "A-Z a-z 0-9 _ . -"
_TAG_RE = re.compile(r"[A-Za-z0-9_.\-]+")


def validate_tag(tag: str) -> str:
    """Return ``tag`` unchanged, or raise :class:`InvalidTag` naming what is wrong."""
    if not isinstance(tag, str) or not tag:
        raise InvalidTag("tag", tag, "must not be empty")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidTag(
            "tag", tag, f"is {len(tag)} characters long; at most {MAX_TAG_LENGTH} are allowed"
        )
    if not _TAG_RE.fullmatch(tag):
        bad = sorted({c for c in tag if not _TAG_RE.fullmatch(c)})
        raise InvalidTag(
            "tag", tag, f"contains {''.join(bad)!r}; allowed characters are {TAG_CHARS}"
        )
    return tag


def register(
    pool: Pool,
    tag: str,
    mode: str,
    table_step: int | None = None,
    wall: Callable[[], float] = time.time,
) -> bool:
    """Make a tag of the database known to the pool (True when it was new; existing state
    is kept). Every registration goes through here: the tag sync, a refill of a tag not
    registered yet, ``leafpool tag add`` and ``leafpool up``. A segment tag carries its
    table's step (the floor of the dynamic step)."""
    fields: dict[str, object] = {}
    if mode == "segment" and table_step is not None:
        fields["table_step"] = table_step
    return pool.register(tag, mode, int(wall() * 1000), **fields)


def register_many(
    pool: Pool, tags: Sequence[tuple[str, str, int | None]], wall: Callable[[], float] = time.time
) -> list[bool]:
    """:func:`register` for many ``(tag, mode, table_step)`` in pipelines (the tag sync of
    thousands of rows): the same writes per tag, a few round trips in all."""
    now_ms = int(wall() * 1000)
    return pool.register_many(
        [
            (
                tag,
                mode,
                now_ms,
                {"table_step": step} if mode == "segment" and step is not None else {},
            )
            for tag, mode, step in tags
        ]
    )
