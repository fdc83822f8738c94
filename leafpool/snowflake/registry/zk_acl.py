"""ZooKeeper's login and the ACL of leafpool's nodes (modes ``zk``, ``zk_recycle``,
``k8s``; docs/design.md §8): with ``LEAFPOOL_ZK_USERNAME``/``_PASSWORD`` the kazoo client
logs in with that digest identity (``auth_data``) and every node it creates is readable and
writable by that identity alone (``default_acl``), so a client without the login can
neither read, take (create beside) nor delete a worker ID's node.

- ``/snowflake``, the parent every name shares (Leaf's layout), is created readable and
  open to new children for everyone, with nothing else (another deployment's name can be
  made beside ours; none can be deleted); an existing one is left as it is.
- ``/snowflake/{LEAFPOOL_SNOWFLAKE_NAME}`` and everything under it get the identity's ACL.
  An earlier release (or a run without the login) made them open: at the first connection
  with the login, every node of the tree is given the ACL, the root last, so a connection
  that finds the root done finds the tree done (one read per connection after that).
- A refusal (the nodes belong to another identity: a wrong password, another deployment
  with the same name) is a :class:`~leafpool.core.errors.ConfigurationError` naming
  ``LEAFPOOL_ZK_USERNAME``, never a retried outage.

Without the login nothing changes: no ``auth_data``, kazoo's open ACL.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from leafpool.core.credentials import ZK_USERNAME_ENV, Login
from leafpool.core.errors import ConfigurationError

log = logging.getLogger(__name__)

#: the parent every snowflake name shares
PARENT = "/snowflake"


def client_options(login: Login) -> dict[str, Any]:
    """KazooClient's keyword arguments for ``login`` (none without one)."""
    if not login.configured:
        return {}
    return {"auth_data": [("digest", login.digest())], "default_acl": owner_acl(login)}


def owner_acl(login: Login) -> list[ACL]:
    """Every permission to the login's digest identity, nothing to anyone else."""
    return [make_digest_acl(login.username, login.password, all=True)]


def parent_acl(login: Login) -> list[ACL]:
    """``/snowflake``: ours entirely; everyone may list it and add a name beside ours."""
    return [*owner_acl(login),
            ACL(Permissions.READ | Permissions.CREATE, Id("world", "anyone"))]


def _refused(login: Login, path: str, what: str) -> ConfigurationError:
    return ConfigurationError(
        ZK_USERNAME_ENV, login.username,
        f"a ZooKeeper identity allowed on {path}: ZooKeeper refused to {what} it (NoAuth). "
        "Its nodes belong to another identity: check LEAFPOOL_ZK_PASSWORD, or whether "
        "another deployment uses this LEAFPOOL_SNOWFLAKE_NAME")


def _tree(client: KazooClient, root: str, timeout_s: float) -> list[str]:
    """Every node under ``root``, deepest first (one level of asynchronous reads at a
    time), ``root`` last."""
    levels = [[root]]
    while levels[-1]:
        pending = [(path, client.get_children_async(path)) for path in levels[-1]]
        below: list[str] = []
        for path, result in pending:
            try:
                below += [f"{path}/{child}" for child in result.get(timeout=timeout_s)]
            except NoNodeError:
                continue  # gone meanwhile (an ephemeral node)
        levels.append(below)
    return [path for level in reversed(levels) for path in level]


def _set(client: KazooClient, paths: list[str], wanted: list[ACL], timeout_s: float) -> int:
    """``wanted`` on each of ``paths`` that lacks it (all at once); how many lacked it."""
    reads = [(path, client.get_acls_async(path)) for path in paths]
    writes = []
    for path, result in reads:
        try:
            current, _ = result.get(timeout=timeout_s)
        except NoNodeError:
            continue  # gone meanwhile
        if list(current) != wanted:
            writes.append(client.set_acls_async(path, wanted))
    for write in writes:
        try:
            write.get(timeout=timeout_s)
        except NoNodeError:
            continue
    return len(writes)


def secure(client: KazooClient, name: str, login: Login, timeout_s: float) -> int:
    """Give ``/snowflake/{name}`` and its tree the login's ACL where they lack it, and make
    ``/snowflake`` if it is missing; the number of nodes changed. Kazoo's errors go up
    (the caller wraps them); NoAuth is a :class:`ConfigurationError`."""
    if not login.configured:
        return 0
    root = f"{PARENT}/{name}"
    wanted = owner_acl(login)
    try:
        client.ensure_path(PARENT, acl=parent_acl(login))
        try:
            acl, _ = client.get_acls(root)
        except NoNodeError:
            return 0  # made with the ACL when the registry creates it
        if list(acl) == wanted:
            return 0
        tree = _tree(client, root, timeout_s)
        changed = _set(client, tree[:-1], wanted, timeout_s) + _set(client, [root], wanted,
                                                                     timeout_s)
    except NoAuthError:
        raise _refused(login, root, "read or change") from None
    log.warning("ZooKeeper: %d nodes under %s had no ACL of %s; given it (nodes an earlier "
                "release or a process without LEAFPOOL_ZK_USERNAME made)", changed, root,
                login.username)
    return changed
