"""``leafpool_snowflake_layout``: the DC layout a MySQL worker-ID registry serves
(snowflake mode ``mysql``, docs/design.md §12.1). One row, ``registry =
'leaf_workerid_alloc'``: which DC of how many leases its worker IDs from this database.
A table of its own, so ``leaf_workerid_alloc`` (NotFound9's DDL) keeps its columns and
the previous release's workers, which never read this table, run beside it unchanged.
``leafpool db init`` creates it on MySQL; a worker reads it and writes its one row
(SELECT, INSERT: ``leafpool db grants worker``)."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, func

#: the key of the row of snowflake mode mysql's table
WORKERID_REGISTRY = "leaf_workerid_alloc"

snowflake_layout = Table(
    "leafpool_snowflake_layout",
    MetaData(),
    Column("registry", String(64), primary_key=True),
    Column("dc_id", Integer, nullable=False),
    Column("dc_count", Integer, nullable=False),
    Column("written_by", String(127), nullable=True),
    Column("create_time", DateTime, nullable=False, server_default=func.current_timestamp()),
    mysql_engine="InnoDB",
)
