"""Tags: the one place that says what a valid ``biz_tag`` is.

Allowed: 1 to 128 characters (Leaf's ``biz_tag varchar(128)``) from ``A-Z a-z 0-9 _ . -``.
Braces, colons and spaces are refused because they would break the Redis key layout
(``leafpool:{TAG}:ids`` uses the tag as a Redis Cluster hash tag).
"""

from __future__ import annotations

import re

from leafpool.core.errors import InvalidTag

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
