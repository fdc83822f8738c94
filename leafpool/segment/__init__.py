"""Segment mode: ranges of a per-tag counter advanced atomically in the database.

Owns: the store (``leaf_alloc``, leafpool's snowflake-tag and retired-mark tables:
:mod:`~leafpool.segment.store`), Leaf's dynamic step rule (:mod:`~leafpool.segment.step`)
and the segment refiller (:mod:`~leafpool.segment.refiller`).

May import: :mod:`leafpool.core`, :mod:`leafpool.redis`, :mod:`leafpool.database`,
:mod:`leafpool.refill`.
"""
