"""Snowflake mode: time-ordered 64-bit IDs from generators that hold a leased worker ID.

Owns: the generator (:mod:`~leafpool.snowflake.generator`), the snowflake refiller
(:mod:`~leafpool.snowflake.refiller`) and the worker-ID registries, one module a mode
(:mod:`~leafpool.snowflake.registry`). The ID layout is
:mod:`leafpool.core.snowflake_layout` (the settings check the epoch with it).

May import: :mod:`leafpool.core`, :mod:`leafpool.redis`, :mod:`leafpool.database` (the
``mysql`` registry), :mod:`leafpool.refill`.
"""
