"""What the beat and the worker run besides refills: deciding which tags need one.

Owns: the tag sync between the database and the pool (:mod:`~leafpool.housekeeping.sync`),
the sweep (:mod:`~leafpool.housekeeping.sweep`) and the drop watcher
(:mod:`~leafpool.housekeeping.watch`). They decide; the Celery code in ``workers/`` acts
(queues the tasks): this room does not import Celery.

May import: :mod:`leafpool.core`, :mod:`leafpool.database` (the tag sync's fingerprint of
the database's tags), :mod:`leafpool.redis`, :mod:`leafpool.refill`,
:mod:`leafpool.segment`.
"""
