"""docker-compose.yml's Redis, run for real outside a container: the redis-acl service's
own script writes the ACL file (with the venv's ``leafpool``), a redis-server starts with
the arguments compose gives the redis service (container paths mapped to test
directories, listening on loopback and on this host's other address, as a container on the
compose network would reach it): no client gets in without a password, each leafpool
service's URL logs in as its role, the health checks pass under their roles, and protected
mode refuses other hosts should the default user be left open. With ``--profile ha``: the
data nodes' and sentinel's own scripts, replication and a failover under those users; the
sentinel asks for a login (none or a wrong one refused, leafpool's user cannot fail it
over), sets its periods as its own user, and passes its health check as leafpool's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.testclient import TestClient

from leafpool.core.config import load_settings
from leafpool.http import create_app
from leafpool.redis.acl import SENTINEL_CLIENT_USER, SENTINEL_PEER_USER
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.redis.register import register
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.servers import Server
from tests.support.topologies import shipped_sentinel_debug
from tests.system.test_compose import (
    ACL_FILE,
    HA_SECRETS,
    ROLE_OF,
    SECRETS,
    compose_config,
    unescape,
)

CONF = "/usr/local/etc/redis/redis.conf"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    services_: dict[str, Any] = compose_config(tmp_path_factory.mktemp("compose"),
                                               {**SECRETS, **HA_SECRETS})["services"]
    return services_


def _external_address() -> str:
    """This host's address on its network (what a container on compose's network has)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: routing only
        except OSError:
            services.unavailable("no network address besides loopback")
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        services.unavailable("no network address besides loopback")
    return address


def _write_acl(config: dict[str, Any], directory: Path, *, default_off: bool = True) -> Path:
    """The ACL file, written by the redis-acl service's own script and environment."""
    service = config["redis-acl"]
    script = unescape(service["command"][-1]).replace("/etc/redis-acl", str(directory))
    if not default_off:  # what an operator's own file without the default line would do
        script = script.replace(" --disable-default", "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update(service["environment"], LEAFPOOL_HOME=str(directory / "home"), COLUMNS="80",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return directory / "users.acl"


def _redis_args(config: dict[str, Any], acl: Path, address: str) -> list[str]:
    """The redis service's arguments (its config file is the shipped one, which the
    helper passes), with the ACL file's path mapped and listening on loopback and
    ``address`` instead of every address."""
    command = list(config["redis"]["command"])
    assert command[:2] == ["redis-server", CONF]
    args = []
    rest = iter(command[2:])
    for arg in rest:
        if arg == "--bind":
            assert next(rest) == "0.0.0.0"
            args += ["--bind", "127.0.0.1", address]
        elif arg == "--dir":
            next(rest)  # the helper's own directory
        else:
            args.append(arg.replace(ACL_FILE, str(acl)))
    return args


@pytest.fixture(scope="module")
def address() -> str:
    return _external_address()


@pytest.fixture(scope="module")
def compose_redis(config: dict[str, Any], address: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    acl = _write_acl(config, tmp_path_factory.mktemp("redis-acl"))
    server = services.redis_server(extra_args=_redis_args(config, acl, address))
    yield server
    server.stop()


def _once(url: str) -> redis.Redis:
    """A client that tries once (redis-py would retry a refused login with backoff)."""
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_timeout=5)


def _here(url: str, address: str, port: int) -> str:
    """A compose URL pointed at the test's server."""
    assert "@redis:6379/" in url
    return url.replace("@redis:6379/", f"@{address}:{port}/")


def test_no_client_reaches_redis_without_a_password(
    compose_redis: Server, address: str
) -> None:
    for host in ("127.0.0.1", address):
        with pytest.raises(redis.AuthenticationError):
            _once(f"redis://{host}:{compose_redis.port}/0").ping()
        with pytest.raises(redis.AuthenticationError):
            _once(f"redis://default:@{host}:{compose_redis.port}/0").ping()
        with pytest.raises(redis.AuthenticationError):  # a role's user, a wrong password
            _once(f"redis://leafpool-admin:nope@{host}:{compose_redis.port}/0").ping()


def test_each_leafpool_service_logs_in_as_its_role(
    config: dict[str, Any], compose_redis: Server, address: str
) -> None:
    for name, role in ROLE_OF.items():
        env = config[name]["environment"]
        if "LEAFPOOL_REDIS_SENTINELS" in env:
            continue  # the ha profile: below
        for variable in ("LEAFPOOL_REDIS_URL", "LEAFPOOL_BROKER_URL"):
            if not env.get(variable):
                continue
            assert urlsplit(env[variable]).username == f"leafpool-{role}"
            client = _once(_here(env[variable], address, compose_redis.port))
            assert client.ping(), (name, variable)
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.flushall()  # a role, not the default user's everything
            client.close()
    app = _once(f"redis://leafpool-app:{SECRETS['LEAFPOOL_ACL_APP_PASSWORD']}"
                f"@{address}:{compose_redis.port}/0")
    assert app.lpop("leafpool:{order}:ids") is None  # the applications' role is there too
    app.close()


def _run_check(test: list[str], env: dict[str, str]) -> int:
    """A health check's exit code (the image's ``python`` is the venv's here); one that
    fails must fail quietly, for its own reason, not on an error."""
    argv = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
    if argv[0] == "python":
        argv[0] = sys.executable
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=30)
    assert "Error" not in done.stderr, done.stderr
    return done.returncode


def test_the_health_checks_pass_under_their_roles(
    config: dict[str, Any], compose_redis: Server, address: str
) -> None:
    port = compose_redis.port
    check = list(config["redis"]["healthcheck"]["test"])
    check[1] = check[1].replace("redis-cli ", f"redis-cli -p {port} ")
    auth = config["redis"]["environment"]["REDISCLI_AUTH"]
    assert _run_check(check, {"REDISCLI_AUTH": auth}) == 0
    assert _run_check(check, {"REDISCLI_AUTH": auth + "x"}) != 0
    # the beat's: its lock, read with the worker role's URL
    beat = config["beat"]
    url = _here(beat["environment"]["LEAFPOOL_REDIS_URL"], address, port)
    env = {"LEAFPOOL_REDIS_URL": url}
    assert _run_check(beat["healthcheck"]["test"], env) == 1  # no beat holds the lock
    worker = _once(url)
    worker.set("leafpool:beat:lock", "a beat", px=60_000)
    assert _run_check(beat["healthcheck"]["test"], env) == 0
    worker.delete("leafpool:beat:lock")
    worker.close()


def test_the_http_service_is_ready_and_shows_the_pools_under_the_http_role(
    config: dict[str, Any], compose_redis: Server, address: str, tmp_path: Path
) -> None:
    """The http service's health check (/health: PING, the tags, the database) and its
    operator pages, under the URL compose gives it; a tag registered by the admin role."""
    database = f"sqlite:///{tmp_path / 'leafpool.sqlite3'}"
    store = SegmentStore.from_url(database)
    store.init_schema()
    store.add_tag("order", step=1000)
    admin = load_settings(redis_url=_here(
        config["admin"]["environment"]["LEAFPOOL_REDIS_URL"], address, compose_redis.port))
    register(Pool(connect(admin)), "order", "segment", 1000)
    http = load_settings(database_url=database, redis_url=_here(
        config["http"]["environment"]["LEAFPOOL_REDIS_URL"], address, compose_redis.port))
    with TestClient(create_app(http)) as c:
        health = c.get("/health")
        assert (health.status_code, health.text) == (200, "ready\n")
        assert c.get("/cache").status_code == 200
        assert c.get("/api/status").json()["tags"][0]["tag"] == "order"
        assert "leafpool_up 1.0" in c.get("/metrics").text
    store.engine.dispose()


def test_protected_mode_refuses_other_hosts_should_the_default_user_be_left_open(
    config: dict[str, Any], address: str, tmp_path: Path
) -> None:
    acl = _write_acl(config, tmp_path, default_off=False)
    server = services.redis_server(extra_args=_redis_args(config, acl, address))
    try:
        assert _once(f"redis://127.0.0.1:{server.port}/0").ping()  # loopback: let in
        with pytest.raises(redis.RedisError, match="DENIED Redis is running in protected mode"):
            _once(f"redis://{address}:{server.port}/0").ping()
    finally:
        server.stop()


# -- --profile ha --------------------------------------------------------------------------

def _node(name: str, script: str, env: dict[str, str], port: int, home: Path,
          subs: dict[str, str]) -> Server:
    """A service's own ``sh -c`` script, with container names and paths mapped; its own
    copy of the shipped redis.conf (a failover's CONFIG REWRITE writes into it)."""
    home.mkdir()
    (home / "redis.conf").write_text((services.ROOT / "ops" / "redis" / "redis.conf").read_text())
    for old, new in subs.items():
        assert old in script, (name, old)
        script = script.replace(old, new.format(home=home, port=port))
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", script]
    server = Server(name, port, home, argv, home.parent / f"{name}.log")
    server.start()
    return server


def _tails(nodes: list[Server], lines: int = 60) -> str:
    """The last lines of each node's log, for a failure message."""
    out = []
    for node in nodes:
        text = node.log.read_text(errors="replace") if node.log.exists() else ""
        out.append(f"--- {node.name} ({node.log.name}) ---\n"
                   + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(out)


def _wait(nodes: list[Server], check: Callable[[], bool], timeout: float, what: str) -> None:
    """:func:`services.wait_until`, its failure showing the nodes' logs."""
    try:
        services.wait_until(check, timeout, what)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{_tails(nodes)}") from exc


def _debug(sentinel: redis.Redis) -> dict[str, Any]:
    """``SENTINEL DEBUG`` (no arguments): the sentinel's periods, by name."""
    reply = sentinel.execute_command("SENTINEL", "DEBUG")  # type: ignore[no-untyped-call]
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2],
                                                              strict=True)
    return {str(k).lower(): v for k, v in pairs}


def _info(url: str) -> dict[str, Any]:
    client = _once(url)
    try:
        return client.info("replication")
    except redis.RedisError:
        return {}
    finally:
        client.close()


@pytest.mark.slow
def test_the_ha_nodes_replicate_and_fail_over_under_their_users(
    config: dict[str, Any], tmp_path: Path
) -> None:
    """The master's, replica's and a sentinel's own scripts: the replica syncs as
    leafpool-replication, the sentinel sees both as leafpool-sentinel, the worker role
    writes through it; after the master is killed the sentinel promotes the replica, and
    the old master, back, syncs from it (it logs in as leafpool-replication too)."""
    (tmp_path / "acl-dir").mkdir()
    acl = _write_acl(config, tmp_path / "acl-dir")
    users = [line.split()[1] for line in acl.read_text().splitlines()]
    assert users[-2:] == ["leafpool-replication", "leafpool-sentinel"]
    mport, rport, sport = (services.free_port() for _ in range(3))
    data = {"/data": "{home}", "docker-entrypoint.sh redis-server": "redis-server",
            CONF: "{home}/redis.conf", "/etc/redis-acl": str(acl.parent),
            "--bind 0.0.0.0": "--bind 127.0.0.1 --port {port}"}
    nodes: list[Server] = []
    try:
        nodes.append(_node("master", unescape(config["redis-ha-master"]["command"][-1]),
                           config["redis-ha-master"]["environment"], mport, tmp_path / "m",
                           data))
        nodes.append(_node(
            "replica", unescape(config["redis-ha-replica-1"]["command"][-1]),
            config["redis-ha-replica-1"]["environment"], rport, tmp_path / "r",
            {**data, "redis-ha-master 6379": f"127.0.0.1 {mport}"}))
        monitor = f"redis://leafpool-monitor:{SECRETS['LEAFPOOL_ACL_MONITOR_PASSWORD']}@127.0.0.1"
        _wait(nodes,
              lambda: _info(f"{monitor}:{rport}/0").get("master_link_status") == "up", 30,
              "the replica's sync as leafpool-replication")
        # the shipped down-after-milliseconds (5000), not a shorter one: right after
        # +switch-master Sentinel reconnects to the new master only once its reconnect
        # period (1 s, counted from its last attempt at the old address) has passed, and
        # counts the new master down from the switch; with 1000 ms it flagged the new
        # master +sdown, and this lone sentinel (quorum 1) failed back to the old master,
        # back but not yet converted to a replica (it reports role master: a candidate)
        nodes.append(_node(
            "sentinel", unescape(config["sentinel-1"]["command"][-1]),
            config["sentinel-1"]["environment"], sport, tmp_path / "s",
            {"port 26379": "port {port}\\nbind 127.0.0.1",
             "-p 26379 SENTINEL": "-p {port} SENTINEL",
             "redis-ha-master 6379 2": f"127.0.0.1 {mport} 1",
             "/tmp/sentinel.conf": "{home}/sentinel.conf"}))
        # leafpool's services log in to the sentinel as its client user; the sentinels to
        # one another as leafpool-sentinel
        sentinel_env = config["sentinel-1"]["environment"]
        client_password = sentinel_env["LEAFPOOL_REDIS_SENTINEL_PASSWORD"]
        sentinel = redis.Redis(port=sport, decode_responses=True, username=SENTINEL_CLIENT_USER,
                               password=client_password)
        peer = redis.Redis(port=sport, decode_responses=True, username=SENTINEL_PEER_USER,
                           password=sentinel_env["REDIS_SENTINEL_PASSWORD"])
        # the script sets the periods sentinel.conf names once the sentinel answers
        wanted = dict(zip(*[iter(shipped_sentinel_debug())] * 2, strict=True))
        _wait(nodes, lambda: {k: str(v) for k, v in _debug(peer).items() if k in wanted}
              == wanted, 30, "the sentinel's SENTINEL DEBUG periods")
        # no login, or a wrong one: refused; leafpool's user may not move the master
        for login in ({}, {"username": SENTINEL_CLIENT_USER, "password": "wrong"}):
            with pytest.raises(redis.AuthenticationError), \
                    redis.Redis(port=sport, socket_timeout=5, **login) as stranger:
                stranger.sentinel_get_master_addr_by_name("leafpool")
        with pytest.raises(redis.exceptions.NoPermissionError):
            sentinel.execute_command("SENTINEL", "FAILOVER", "leafpool")  # type: ignore[no-untyped-call]
        # the health check, as its container runs it (the password from its environment)
        check = unescape(config["sentinel-1"]["healthcheck"]["test"][1])
        assert "-p 26379" in check and "grep -q redis-ha" in check
        check = check.replace("-p 26379", f"-p {sport}").replace("redis-ha", "127.0.0.1")
        _wait(nodes, lambda: subprocess.run(["sh", "-c", check], env={**os.environ, **sentinel_env},
                                            timeout=10).returncode == 0,
              30, "the sentinel's health check")
        assert subprocess.run(["sh", "-c", check], timeout=10, capture_output=True, env={
            **os.environ, **sentinel_env, "LEAFPOOL_REDIS_SENTINEL_PASSWORD": "wrong"}
        ).returncode != 0

        def sees(master: int, replicas: int) -> bool:
            state = sentinel.sentinel_master("leafpool")
            return (int(state["port"]) == master and state["flags"] == "master"
                    and int(state["num-slaves"]) == replicas
                    and all(r["flags"] == "slave"
                            for r in sentinel.sentinel_slaves("leafpool")))

        _wait(nodes, lambda: sees(mport, 1), 30, "the sentinel's view, logged in")
        # the worker's pools, as leafpool opens them from the service's settings
        worker_env = config["segment-worker-ha"]["environment"]
        worker = load_settings(
            redis_url=worker_env["LEAFPOOL_REDIS_URL"],
            redis_sentinel_username=worker_env["LEAFPOOL_REDIS_SENTINEL_USERNAME"],
            redis_sentinel_password=worker_env["LEAFPOOL_REDIS_SENTINEL_PASSWORD"],
            redis_sentinels=f"127.0.0.1:{sport}", redis_master_name="leafpool",
            database_url=f"sqlite:///{tmp_path / 'leafpool.sqlite3'}")

        def write(value: str) -> None:
            master = connect(worker)
            master.set("leafpool:probe", value)
            assert master.wait(1, 5000) == 1  # the replica has it
            master.close()

        write("before")
        nodes[0].kill(signal.SIGKILL)
        _wait(nodes, lambda: sentinel.sentinel_get_master_addr_by_name("leafpool")[1] == rport,
              60, "the failover")
        old = _info(f"{monitor}:{rport}/0")
        assert old.get("role") == "master"
        nodes[0].start()  # the old master, back: the sentinel makes it a replica

        def synced() -> bool:
            info = _info(f"{monitor}:{mport}/0")
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

        _wait(nodes, synced, 90, "the old master's sync from the new one")
        write("after")
        # Sentinel's CONFIG REWRITE kept the conversion in the node's own file, which its
        # next start writes anew: killed and restarted, the old master comes back as the
        # new master's replica at once, not as a master for Sentinel to convert again (nor,
        # for a replica, following its first master: --replicaof on the command line)
        nodes[0].kill(signal.SIGKILL)
        nodes[0].start()
        _wait(nodes, lambda: bool(_info(f"{monitor}:{mport}/0")), 30, "the old master back")
        back = _info(f"{monitor}:{mport}/0")
        assert (back.get("role"), back.get("master_port")) == ("slave", rport), back
        own = (tmp_path / "m" / "node.conf").read_text()
        assert own.startswith(f"include {tmp_path / 'm'}/redis.conf\n")
        assert f"replicaof 127.0.0.1 {rport}" in own
        sentinel.close()
        peer.close()
    finally:
        for node in reversed(nodes):
            node.stop()
