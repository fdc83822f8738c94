"""What the two refillers share: the per-tag refill skeleton and the pool sizing rule.

Owns: the refiller base (one refill at a time per tag under its lock, the measurement of
consumption, the failure record: :mod:`~leafpool.refill.base`), the sizing rule (rate to
target, smoothing, bursts: :mod:`~leafpool.refill.sizing`) and refills of many tags in
one call (:mod:`~leafpool.refill.batch`).

May import: :mod:`leafpool.core`, :mod:`leafpool.redis`.
"""
