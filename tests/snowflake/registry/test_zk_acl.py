"""ZooKeeper with a login (issue 27 item 5; leafpool/snowflake/registry/zk_acl.py): with
``LEAFPOOL_ZK_USERNAME``/``_PASSWORD`` the registries of modes ``zk``, ``zk_recycle`` and
``k8s`` log in with that digest identity and their nodes are that identity's alone, against
a real ZooKeeper:

- a client without the login, or with a wrong password, can neither take a worker ID
  (create a forever node, a lease), nor delete or overwrite one, nor read them; the
  holder goes on; a leafpool process without the login is refused, one with a wrong
  password is refused naming ``LEAFPOOL_ZK_USERNAME``;
- an upgrade: the open nodes an earlier release made get the login's ACL at the first
  claim with it (the identity keeps its worker ID), after which the old process is
  refused too;
- the DC layout record (``/snowflake/{name}/layout``) is the login's alone too: a client
  without it can neither read, forge nor delete it;
- ``/snowflake`` (every name's parent) stays open to new names and to nothing else;
- a ZooKeeper configured as compose configures it (``enforce.auth``) closes the session of
  a client that sends no login at all.

Against the code before these settings the stranger's deletes succeed: the tests fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions

from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import ConfigurationError, LeafpoolError
from leafpool.snowflake.registry import open_registry
from leafpool.snowflake.registry.zk_acl import owner_acl
from tests.support import services
from tests.support.zk_helpers import raw_client, unique_name, wait_serving

USER, PASSWORD = "leafpool", "zk pass:word"
LOGIN = {"zk_username": USER, "zk_password": PASSWORD}
pytestmark = pytest.mark.timeout(180)


def _settings(hosts: str, name: str, mode: str, tmp_path: Path, **more: Any) -> Settings:
    return load_settings(**{"zk_hosts": hosts, "snowflake_name": name, "snowflake_mode": mode,
                            "snowflake_cache_dir": str(tmp_path / "cache"),
                            "snowflake_pod_index": 3, **more})


@contextmanager
def _stranger(hosts: str, password: str | None = None) -> Iterator[KazooClient]:
    """A kazoo client without leafpool's login (``password``: with its user and that
    password instead)."""
    auth = [("digest", f"{USER}:{password}")] if password is not None else None
    with raw_client(hosts, auth) as client:
        yield client


def _refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except NoAuthError:
        return True
    return False


@pytest.mark.parametrize("mode", ["zk", "zk_recycle", "k8s"])
@pytest.mark.parametrize("password", [None, "wrong"], ids=["no login", "wrong password"])
def test_a_client_without_the_login_cannot_take_delete_or_read_a_worker_id(
    zk_hosts: str, tmp_path: Path, mode: str, password: str | None
) -> None:
    name = unique_name()
    registry: Any = open_registry(_settings(zk_hosts, name, mode, tmp_path, **LOGIN),
                                  f"host-{mode}:w:0", background=False)
    lease = registry.claim()
    root = f"/snowflake/{name}"
    try:
        if mode == "zk":
            held, folder = registry.node_path, registry.forever
            take = lambda z: z.create(f"{folder}/evil:1-", b"{}", sequence=True)  # noqa: E731
        else:
            held, folder = registry.lease_path(lease.worker_id), registry.lease_dir
            other = registry.lease_path(lease.worker_id + 1)
            take = lambda z: z.create(other, b"{}", ephemeral=True)  # noqa: E731
        with _stranger(zk_hosts, password) as z:
            attempts = {
                "take a worker ID": lambda: take(z),
                "delete the held node": lambda: z.delete(held),
                "overwrite it": lambda: z.set(held, b"{}"),
                "read it": lambda: z.get(held),
                "list the worker IDs": lambda: z.get_children(folder),
                "delete the whole tree": lambda: z.delete(root, recursive=True),
                "change its ACL": lambda: z.set_acls(held, [
                    ACL(Permissions.ALL, Id("world", "anyone"))]),
                # the DC layout the tree serves (docs/design.md §12.1): a forged record
                # would let another DC's workers in, a deleted one re-drawn by any layout
                "read the DC layout": lambda: z.get(registry.layout_path),
                "forge the DC layout": lambda: z.set(registry.layout_path,
                                                     b'{"dc_id": 1, "dc_count": 2}'),
                "delete the DC layout": lambda: z.delete(registry.layout_path),
            }
            allowed = [what for what, attempt in attempts.items() if not _refused(attempt)]
        assert allowed == []
        assert registry.client.get_acls(held)[0] == owner_acl(registry.settings.zk_login)
        assert registry.client.get_acls(registry.layout_path)[0] == owner_acl(
            registry.settings.zk_login)
        registry.renew_now()  # the holder goes on
        # leafpool without the login: refused; with a wrong password: refused, named
        plain: Any = open_registry(_settings(zk_hosts, name, mode, tmp_path, snowflake_pod_index=4),
                                   f"other-{mode}:w:0", background=False)
        with pytest.raises(LeafpoolError):
            plain.claim()
        wrong: Any = open_registry(
            _settings(zk_hosts, name, mode, tmp_path, zk_username=USER, zk_password="wrong",
                      snowflake_pod_index=5), f"third-{mode}:w:0", background=False)
        with pytest.raises(ConfigurationError) as named:
            wrong.claim()
        assert named.value.field == "LEAFPOOL_ZK_USERNAME" and "wrong" not in str(named.value)
    finally:
        registry.release()


@pytest.mark.parametrize("mode", ["zk", "zk_recycle"])
def test_an_upgrade_gives_the_open_nodes_the_login_s_acl(
    zk_hosts: str, tmp_path: Path, mode: str
) -> None:
    name = unique_name()
    identity = f"host-{mode}:w:0"
    old: Any = open_registry(_settings(zk_hosts, name, mode, tmp_path / "old"), identity,
                             background=False)
    first = old.claim().worker_id
    before = old.node_path if mode == "zk" else old.hw_path(first)
    old.release()
    with _stranger(zk_hosts) as z:
        assert not _refused(lambda: z.get(before))  # an earlier release's: open
    new: Any = open_registry(_settings(zk_hosts, name, mode, tmp_path / "new", **LOGIN),
                             identity, background=False)
    assert new.claim().worker_id == first  # the same identity keeps its worker ID
    try:
        wanted = owner_acl(new.settings.zk_login)
        with _stranger(zk_hosts) as z:
            assert _refused(lambda: z.delete(before))
            assert _refused(lambda: z.delete(f"/snowflake/{name}", recursive=True))
        for path in _walk(new.client, f"/snowflake/{name}"):
            assert new.client.get_acls(path)[0] == wanted, path
        # the earlier release, started again without the login: refused
        again: Any = open_registry(_settings(zk_hosts, name, mode, tmp_path / "again"),
                                   f"other-{mode}:w:0", background=False)
        with pytest.raises(LeafpoolError):
            again.claim()
    finally:
        new.release()


def _walk(client: KazooClient, path: str) -> list[str]:
    return [path, *(p for child in client.get_children(path)
                    for p in _walk(client, f"{path}/{child}"))]


@pytest.fixture(scope="module")
def enforcing_zk() -> Iterator[str]:
    """A ZooKeeper of the module's own, configured as docker-compose.yml's (ZOO_CFG_EXTRA:
    every session must log in) and with no /snowflake yet."""
    server = services.zookeeper_server("enforce.auth.enabled=true\n"
                                       "enforce.auth.schemes=digest\n")
    wait_serving(server.extra["hosts"])
    try:
        yield server.extra["hosts"]
    finally:
        server.stop()


def test_compose_s_zookeeper_closes_a_session_without_a_login_and_serves_leafpool(
    enforcing_zk: str, tmp_path: Path
) -> None:
    registry: Any = open_registry(_settings(enforcing_zk, "leafpool", "k8s", tmp_path,
                                            **LOGIN), "pod:w:0", background=False)
    assert registry.claim().worker_id == 3
    try:
        # /snowflake, made by leafpool: ours, and open to another deployment's name only
        acl, _ = registry.client.get_acls("/snowflake")
        assert sorted(acl) == sorted([*owner_acl(registry.settings.zk_login),
                                      ACL(Permissions.READ | Permissions.CREATE,
                                          Id("world", "anyone"))])
        client = KazooClient(hosts=enforcing_zk, timeout=10)
        client.start(timeout=15)
        try:
            with pytest.raises(Exception) as closed:
                client.get("/snowflake")
            assert "Sasl" in type(closed.value).__name__ or "Auth" in type(closed.value).__name__
        finally:
            client.stop()
            client.close()
        with _stranger(enforcing_zk, "another password") as z:  # logged in as someone
            z.create("/snowflake/another-deployment", b"")  # a name beside ours
            assert _refused(lambda: z.delete("/snowflake/leafpool", recursive=True))
            assert _refused(lambda: z.set_acls("/snowflake", [
                ACL(Permissions.ALL, Id("world", "anyone"))]))
    finally:
        registry.release()


def test_snowflake_layout_set_runs_with_the_login_and_is_refused_without_it(
    zk_hosts: str, tmp_path: Path
) -> None:
    """``leafpool snowflake layout --set`` (layout_admin.py) needs no ACL of its own: it
    runs with the workers' login, the one identity the tree's nodes allow (zk_acl.py is
    unchanged); without the login, or with a wrong password, it is refused naming
    LEAFPOOL_ZK_USERNAME and the record stays as it was."""
    from leafpool.snowflake.registry import layout_admin

    name = unique_name()
    registry: Any = open_registry(_settings(zk_hosts, name, "zk_recycle", tmp_path, **LOGIN),
                                  "host-a:w:0", background=False)
    registry.claim()
    try:
        for login in ({}, {"zk_username": USER, "zk_password": "wrong"}):
            with pytest.raises(ConfigurationError) as refused:
                layout_admin.set_layout(_settings(zk_hosts, name, "zk_recycle", tmp_path,
                                                  dc_count=2, **login))
            assert refused.value.field == "LEAFPOOL_ZK_USERNAME"
            assert "NoAuth" in str(refused.value) and "wrong" not in str(refused.value)
        shown = layout_admin.inspect(_settings(zk_hosts, name, "zk_recycle", tmp_path,
                                               dc_count=2, **LOGIN))
        assert shown.recorded == (0, 1)
        done = layout_admin.set_layout(_settings(zk_hosts, name, "zk_recycle", tmp_path,
                                                 dc_count=2, **LOGIN))
        assert done.written and done.recorded == (0, 2)
        layout_path = registry.layout_path
        assert registry.client.get_acls(layout_path)[0] == owner_acl(registry.settings.zk_login)
        with _stranger(zk_hosts) as z:
            assert _refused(lambda: z.get(layout_path))
    finally:
        registry.release()
