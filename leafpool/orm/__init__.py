"""IDs where Python applications assign keys: their ORM (docs/design.md §1.3).

- :mod:`leafpool.orm.sqlalchemy`: ``leafpool_id(tag)``, a column default;
- :mod:`leafpool.orm.django`: ``LeafpoolIdField(tag=...)``, a model field;
- :mod:`leafpool.orm.batch`: what both take IDs through, a statement's IDs in one pop.
"""
