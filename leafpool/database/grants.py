"""What each role may do in MySQL/MariaDB (docs/design.md §1.2), as GRANT statements:
``leafpool db grants`` prints them for the database of ``LEAFPOOL_DATABASE_URL``.

- ``admin``: ``leafpool db init`` (the one DDL path: CREATE) and ``tag add/step/remove/
  guard`` (it writes ``leafpool_tag_guard``, and reads a guard's table once to check it);
- ``worker``: a refill (SELECT and UPDATE of ``leaf_alloc``, SELECT of the retired marks
  and of the tags' guards), the tag sync (it lists snowflake tags and keeps the mark of a
  tag gone from the table), and snowflake mode ``mysql`` (``leaf_workerid_alloc``, and
  the DC layout it serves: reads and writes once the one row of
  ``leafpool_snowflake_layout``, never changes it); no DDL, no DELETE. A tag's guard
  also needs SELECT on the application's table it names, which this module cannot
  know: :func:`grants` ends the worker's lines with a comment saying so (docs/design.md §7.3);
- ``monitor`` and ``http``: the ``/db`` page (SELECT of the tag tables);
- ``app``: nothing: applications never reach the database.
"""

from __future__ import annotations

from leafpool.core.errors import InvalidArgument

ROLES = ("admin", "worker", "monitor", "http", "app")

#: role -> (privileges, table or "*")
_GRANTS: dict[str, list[tuple[str, str]]] = {
    "admin": [("SELECT, INSERT, UPDATE, DELETE, CREATE", "*")],
    "worker": [
        ("SELECT, UPDATE", "leaf_alloc"),
        ("SELECT, INSERT, UPDATE", "leafpool_retired_tag"),
        ("SELECT", "leafpool_snowflake_tag"),
        ("SELECT", "leafpool_tag_guard"),
        ("SELECT, INSERT, UPDATE", "leaf_workerid_alloc"),
        ("SELECT, INSERT", "leafpool_snowflake_layout"),
    ],
    "monitor": [("SELECT", "leaf_alloc"), ("SELECT", "leafpool_snowflake_tag")],
    "http": [("SELECT", "leaf_alloc"), ("SELECT", "leafpool_snowflake_tag")],
    "app": [],
}


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def grants(role: str, database: str, user: str, host: str = "%") -> list[str]:
    """The GRANT statements of ``role`` for ``user``@``host`` on ``database``."""
    if role not in _GRANTS:
        raise InvalidArgument("role", role, f"one of {', '.join(ROLES)}")
    who = f"'{user}'@'{host}'"
    lines = [f"GRANT {privileges} ON {_quote(database)}."
             f"{'*' if table == '*' else _quote(table)} TO {who};"
             for privileges, table in _GRANTS[role]]
    if role == "worker":  # the guarded tables are the application's, not known here
        lines.append(f"-- and for each tag guard (leafpool tag guard TAG): GRANT SELECT ON "
                     f"{_quote(database)}.`TABLE` TO {who};")
    return lines


def database_of(url: str) -> str:
    """The database name of a MySQL URL."""
    from leafpool.database.engine import parse_url  # SQLAlchemy: not at the CLI's start

    parsed = parse_url(url)
    if parsed.get_backend_name() != "mysql" or not parsed.database:
        raise InvalidArgument("LEAFPOOL_DATABASE_URL", parsed.render_as_string(True),
                              "a MySQL/MariaDB URL naming its database (grants are MySQL's)")
    return str(parsed.database)
