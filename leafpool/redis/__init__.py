"""The Redis layer: everything leafpool does to Redis, and the only room that does it.

Owns: connections for each topology and redis-py's errors turned into leafpool's
(:mod:`~leafpool.redis.connect`); the pool's commands on a tag's keys, blocking
(:mod:`~leafpool.redis.pool`, many tags at once in :mod:`~leafpool.redis.pool_many`,
shapes and command recipes in :mod:`~leafpool.redis.pool_common`) and asyncio
(:mod:`~leafpool.redis.pool_async`); tag registration (:mod:`~leafpool.redis.register`);
the refill lock (:mod:`~leafpool.redis.lock`); the Lua scripts, one ``.lua`` file each
under ``lua/`` (:mod:`~leafpool.redis.scripts`); replicas, acknowledged pops and
failovers (:mod:`~leafpool.redis.replicas`); coalesced pops
(:mod:`~leafpool.redis.coalesce`); the drop watcher's tracked connections
(:mod:`~leafpool.redis.tracking`).

May import: :mod:`leafpool.core`. Every Redis command on a pool key is issued from a
module of this room (``tests/test_architecture.py`` checks it for every command the test
suite sends).
"""
