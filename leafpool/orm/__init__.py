"""IDs where Python applications assign keys: their ORM (docs/design.md §1.3).

- :mod:`~leafpool.orm.batch`: what both integrations take IDs through, a statement's IDs
  in one pop, the prefetch bound, threads and forks;
- :mod:`~leafpool.orm.sqlalchemy`: ``leafpool_id(tag)``, a column default (and
  ``IdString``), with a ``before_flush`` listener for ORM flushes;
- :mod:`~leafpool.orm.django`: ``LeafpoolIdField(tag=...)``, a model field;
- :mod:`~leafpool.orm.ids`: an ID as a value (an int, or a decimal string for JavaScript).

Owns: the ORM integrations (a room of the surfaces, beside ``http/``). Neither
SQLAlchemy's nor Django's module is imported here: Django is an optional extra.

May import: :mod:`leafpool.client`, :mod:`leafpool.core`. Every Redis command goes through
the :class:`~leafpool.client.Client` (the ``app`` role is enough).
"""
