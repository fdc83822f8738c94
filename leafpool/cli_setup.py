"""The CLI's setup commands: ``leafpool db init`` (the one DDL path), ``leafpool db
grants`` (each role's GRANT statements) and ``leafpool redis acl`` (the Redis roles as an
ACL file; ``leafpool acl`` is the same command), docs/design.md §1.2."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from leafpool.cli_common import out, reports_errors, runtime
from leafpool.core.config import get_settings, hide_password
from leafpool.core.errors import ConfigurationError
from leafpool.database import grants
from leafpool.redis import acl

db_app = typer.Typer(no_args_is_help=True, help="The segment store (leaf_alloc).")
redis_app = typer.Typer(no_args_is_help=True, help="Redis: the roles' ACL.")

# the options `db grants` and `redis acl` share: ROLES (default: all ``known``), --user-prefix
UserPrefix = Annotated[str, typer.Option(help="user name = prefix + role")]


def _roles(known: tuple[str, ...]) -> Any:
    return typer.Argument(help=f"roles to print (default: all of {', '.join(known)})")


@db_app.command("init")
@reports_errors
def db_init() -> None:
    """Create leaf_alloc (Leaf's DDL) unless it exists, and leafpool's own tables."""
    rt = runtime()
    created = rt.store.init_schema()
    where = hide_password(rt.settings.database_url)
    out.print(f"leaf_alloc {'created' if created else 'already exists'} in {where}")


@db_app.command("grants")
@reports_errors
def db_grants(
    roles: Annotated[list[str] | None, _roles(grants.ROLES)] = None,
    user_prefix: UserPrefix = "leafpool-",
    host: Annotated[str, typer.Option(help="the users' host part")] = "%",
) -> None:
    """Print the GRANT statements each role needs on the database of
    LEAFPOOL_DATABASE_URL (MySQL/MariaDB); create the users first."""
    database = grants.database_of(get_settings().database_url)
    for role in roles or grants.ROLES:
        for line in grants.grants(role, database, f"{user_prefix}{role}", host):
            out.print(line, highlight=False, soft_wrap=True)


#: the default user, off: no client reaches Redis without a user name and password
DEFAULT_OFF = "user default off resetpass resetkeys resetchannels -@all"


def _password(role: str) -> str:
    return f"LEAFPOOL_ACL_{role.upper()}_PASSWORD"


@redis_app.command("acl")
@reports_errors
def redis_acl(
    roles: Annotated[list[str] | None, _roles(acl.ROLES)] = None,
    user_prefix: UserPrefix = "leafpool-",
    disable_default: Annotated[bool, typer.Option(
        "--disable-default",
        help="also print a line disabling Redis's default user (an ACL file that does "
             "not name it leaves it on, without a password, allowed everything)")] = False,
) -> None:
    """Print the roles as lines of a Redis ACL file (users.acl), each password read from
    LEAFPOOL_ACL_<ROLE>_PASSWORD and written as its SHA-256; nothing when one is missing."""
    settings = get_settings()
    # the broker's database: the path of its (first) URL, without the query
    db_text = settings.broker_url.split(";")[0].split("?")[0].rsplit("/", 1)[-1]
    db = int(db_text) if db_text.isascii() and db_text.isdigit() else 0
    lines = [DEFAULT_OFF] if disable_default else []
    for role in roles or acl.ROLES:
        name = _password(role)
        if role not in acl.ROLES:
            acl.rules(role)  # raises InvalidArgument naming the roles
        secret = os.environ.get(name, "")
        if not secret:
            raise ConfigurationError(name, "", f"the password of the {role} role's Redis user")
        lines.append(acl.user_line(f"{user_prefix}{role}", role, secret, settings.key_prefix,
                                   settings.broker_key_prefix, db))
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True)
