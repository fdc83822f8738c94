"""Segment mode: ranges of a per-tag counter advanced atomically in the database.

Owns: the store (``leaf_alloc``, leafpool's snowflake-tag, retired-mark and guard tables:
:mod:`~leafpool.segment.store`, with its values in :mod:`~leafpool.segment.values`), one
allocation's steps and the heal of a rewound counter (:mod:`~leafpool.segment.counter`),
the reading of a tag's guard (:mod:`~leafpool.segment.guards`), Leaf's dynamic step rule
(:mod:`~leafpool.segment.step`) and the segment refiller (:mod:`~leafpool.segment.refiller`).

May import: :mod:`leafpool.core`, :mod:`leafpool.redis`, :mod:`leafpool.database`,
:mod:`leafpool.refill`.
"""
