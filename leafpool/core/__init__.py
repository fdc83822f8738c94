"""The ground floor: what every other room stands on, and nothing above it.

Owns: the error tree (:mod:`~leafpool.core.errors`), the Redis key names
(:mod:`~leafpool.core.keys`), durations as people read them
(:mod:`~leafpool.core.durations`), what a valid tag name is (:mod:`~leafpool.core.tags`),
the settings read from the environment and validated once
(:mod:`~leafpool.core.config`, :mod:`~leafpool.core.backend_settings`,
:mod:`~leafpool.core.setting_values`, :mod:`~leafpool.core.tls`,
:mod:`~leafpool.core.credentials`), and the snowflake
ID layout the generator and the settings share (:mod:`~leafpool.core.snowflake_layout`),
and the release this code is (:mod:`~leafpool.core.version`).

May import: nothing of leafpool outside this room. Issues no Redis command and no SQL.
"""
