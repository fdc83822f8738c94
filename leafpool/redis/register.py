"""Registering a tag of the database with the pool: the one place every registration
goes through (the tag sync, a refill of a tag not registered yet, ``leafpool tag add``
and ``leafpool up``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from leafpool.redis.pool import Pool


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
