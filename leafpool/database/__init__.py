"""The database boundary: engines, transactions, driver errors and the table
definitions, shared by the segment store and the snowflake ``mysql`` registry.

Owns: :mod:`~leafpool.database.engine` (with :mod:`~leafpool.database.hosts`, a URL naming
several hosts), the schema and the roles' grants
(:mod:`~leafpool.database.schema`, :mod:`~leafpool.database.grants`), a tag's guard and
its query (:mod:`~leafpool.database.guard`), and the DDL files under ``sql/<dialect>/``
(Leaf's ``leaf_alloc`` and NotFound9's ``leaf_workerid_alloc``, unchanged;
docker-compose mounts ``sql/mysql`` as MySQL's init scripts).

May import: :mod:`leafpool.core`. Its own room (not the segment's) because the snowflake
``mysql`` worker-ID registry uses it too.
"""
