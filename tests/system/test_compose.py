"""docker-compose.yml and the Dockerfile: validated by Debian's docker-compose
(`docker-compose config`, no Docker engine needed) and checked for what a production-like
start needs: every service, healthchecks, depends_on conditions, volumes, settings; and
its secure default (issue 18): every secret required, Redis's ACL file loaded with the
default user off and protected mode on, each leafpool service logged in as its role,
published ports on loopback, Flower behind basic auth. tests/system/test_compose_redis.py
runs the Redis side for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from leafpool.core.backend_settings import SENTINEL_TIMEOUTS
from leafpool.core.config import Settings
from leafpool.redis import acl
from tests.support.services import missing
from tests.support.topologies import shipped_sentinel_debug

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CORE = {"mysql", "redis", "zookeeper", "segment-worker", "snowflake-worker", "beat", "flower",
        "http"}
LEAFPOOL_SERVICES = {"segment-worker", "snowflake-worker", "beat", "flower", "http"}
#: the Redis role of every service running the leafpool image (but redis-acl, which
#: writes the ACL file and logs in to nothing)
ROLE_OF = {"segment-worker": "worker", "snowflake-worker": "worker", "beat": "worker",
           "flower": "worker", "http": "http", "migrate": "admin", "admin": "admin",
           "segment-worker-ha": "worker", "http-ha": "http"}
ROLES = ("app", "worker", "monitor", "http", "admin")
#: what an operator's .env must hold (README, docker compose): a dummy value each, told
#: apart from one another
SECRETS = {
    "MYSQL_PASSWORD": "dummy-mysql", "MYSQL_ROOT_PASSWORD": "dummy-mysql-root",
    **{f"LEAFPOOL_ACL_{role.upper()}_PASSWORD": f"dummy-{role}" for role in ROLES},
    "FLOWER_BASIC_AUTH": "flower:dummy-flower",
    "LEAFPOOL_ZK_PASSWORD": "dummy-zookeeper",
}
#: needed by `--profile ha` only (its nodes refuse to start without them)
HA_SECRETS = {"REDIS_REPLICATION_PASSWORD": "dummy-replication",
              "REDIS_SENTINEL_PASSWORD": "dummy-sentinel",
              "LEAFPOOL_REDIS_SENTINEL_PASSWORD": "dummy-sentinel-client"}
DATA_NODES = ("redis", "redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2")
ACL_FILE = "/etc/redis-acl/users.acl"


def compose(tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` with ``env`` only (no developer's .env or shell variable
    leaks in)."""
    binary = shutil.which("docker-compose")
    if binary is None:
        missing("docker-compose (Debian package docker-compose)")
    assert binary
    empty = tmp / "empty.env"
    empty.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("LEAFPOOL_", "MYSQL_", "COMPOSE_", "REDIS_", "FLOWER_"))}
    return subprocess.run([binary, "-f", str(COMPOSE), "--env-file", str(empty), "config"],
                          cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                          timeout=60)


def compose_config(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    done = compose(tmp, env)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def unescape(text: str) -> str:
    """A command as the container's shell gets it (`config` prints ``$`` as ``$$``)."""
    return text.replace("$$", "$")


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors, merges, variables applied), with
    every secret set."""
    return compose_config(tmp_path_factory.mktemp("compose"), {**SECRETS, **HA_SECRETS})


@pytest.fixture(scope="module")
def services(resolved: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = resolved["services"]
    return result


def test_docker_compose_accepts_the_file(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) >= CORE


def test_every_core_service_has_a_healthcheck(services: dict[str, Any]) -> None:
    for name in CORE:
        check = services[name].get("healthcheck")
        assert check and check["test"], name
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_depends_on_waits_for_healthy_backends(services: dict[str, Any]) -> None:
    want = {
        "segment-worker": {"redis", "mysql"},
        "snowflake-worker": {"redis", "zookeeper"},
        "beat": {"redis"},
        "flower": {"redis"},
        "http": {"redis", "mysql"},
    }
    for name, backends in want.items():
        deps = services[name]["depends_on"]
        assert isinstance(deps, dict), f"{name}: depends_on needs the long form with conditions"
        for backend in backends:
            assert deps[backend]["condition"] == "service_healthy", (name, backend)
    for name, spec in services.items():
        for dep, cond in spec.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            assert cond["condition"] in ("service_healthy", "service_completed_successfully")
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
    # the schema exists before anything that reads it starts
    for name in ("segment-worker", "snowflake-worker", "http"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully")
    assert services["migrate"]["command"] == ["leafpool", "db", "init"]


def test_images_versions_and_commands(services: dict[str, Any]) -> None:
    assert services["mysql"]["image"].startswith("mysql:8")
    assert services["redis"]["image"].startswith("redis:7")
    assert services["zookeeper"]["image"].startswith("zookeeper:3.8")
    cmd = {name: " ".join(services[name]["command"]) for name in LEAFPOOL_SERVICES}
    assert re.search(r"celery -A workers worker -Q leafpool\.segment,leafpool\.control\b",
                     cmd["segment-worker"])
    assert re.search(r"celery -A workers worker -Q leafpool\.snowflake\b",
                     cmd["snowflake-worker"])
    assert cmd["beat"].startswith("celery -A workers beat")
    assert cmd["flower"].startswith("celery -A workers flower")
    assert cmd["http"] == "leafpool serve"
    for name in LEAFPOOL_SERVICES:
        assert services[name]["image"] == "leafpool:latest"
        assert services[name]["build"]["dockerfile"] == "Dockerfile"


def _mounts(spec: dict[str, Any]) -> dict[str, str]:
    out = {}
    for volume in spec.get("volumes", []):
        if isinstance(volume, dict):
            out[volume["target"]] = volume["source"]
        else:
            source, target = volume.split(":")[:2]
            out[target] = source
    return out


def test_configs_and_data_volumes_are_mounted(
    services: dict[str, Any], resolved: dict[str, Any]
) -> None:
    redis_mounts = _mounts(services["redis"])
    conf = Path(redis_mounts["/usr/local/etc/redis/redis.conf"])
    assert conf == ROOT / "ops" / "redis" / "redis.conf" and conf.is_file()
    assert "/usr/local/etc/redis/redis.conf" in services["redis"]["command"]
    mysql_mounts = _mounts(services["mysql"])
    init = Path(mysql_mounts["/docker-entrypoint-initdb.d"])
    assert init == ROOT / "leafpool" / "database" / "sql" / "mysql" and list(init.glob("*.sql"))
    named = set(resolved["volumes"])
    for name, path in [("mysql", "/var/lib/mysql"), ("redis", "/data"),
                       ("zookeeper", "/data"), ("snowflake-worker", "/var/lib/leafpool")]:
        assert _mounts(services[name])[path] in named, name
    prometheus = _mounts(services["prometheus"])["/etc/prometheus/prometheus.yml"]
    assert Path(prometheus) == ROOT / "ops" / "prometheus" / "prometheus.yml"


def test_leafpool_environment_names_real_settings(services: dict[str, Any]) -> None:
    known = {f"LEAFPOOL_{name.upper()}" for name in Settings.model_fields} | {"LEAFPOOL_HOME"}
    for name in LEAFPOOL_SERVICES:
        env = services[name]["environment"]
        names = {k for k in env if k.startswith("LEAFPOOL_")}
        assert names - known == set(), name
        assert env["LEAFPOOL_REDIS_URL"].endswith("@redis:6379/0"), name
        assert env["LEAFPOOL_DATABASE_URL"] == (
            f"mysql+pymysql://leaf:{SECRETS['MYSQL_PASSWORD']}@mysql:3306/leaf")
        assert env["LEAFPOOL_ZK_HOSTS"] == "zookeeper:2181"
    assert services["http"]["environment"]["LEAFPOOL_HTTP_HOST"] == "0.0.0.0"


def test_raw_file_parses_and_dockerfile_installs_the_package() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    assert set(raw["services"]) >= CORE
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "pip install --require-hashes -r requirements/run.txt" in dockerfile
    assert "pip install --no-deps ." in dockerfile
    for path in ("requirements/run.txt", "pyproject.toml", "leafpool", "workers"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", dockerfile, re.M), path
        assert (ROOT / path).exists()


def test_the_ha_profile_runs_a_master_two_replicas_three_sentinels_and_follows_them(
    services: dict[str, Any],
) -> None:
    """Two replicas and pops every replica acknowledges (docs/design.md §7.1); the
    sentinels with the shipped sentinel.conf's timings and SENTINEL DEBUG periods; every
    data node restarts at once (pops wait while one is away)."""
    ha = {name for name, svc in services.items() if "ha" in svc.get("profiles", [])}
    assert ha == {"redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2", "sentinel-1",
                  "sentinel-2", "sentinel-3", "segment-worker-ha", "http-ha"}
    for name in ("redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2"):
        # the node's own file, which Sentinel's CONFIG REWRITE keeps: no --replicaof, which
        # would send a restarted replica back to its first master
        script = unescape(services[name]["command"][-1])
        assert "redis-server /data/node.conf" in script and "--replicaof" not in script
        first = "r='replicaof redis-ha-master 6379'" if "replica" in name else "r=''"
        assert first in script, name
    for name in ("redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2"):
        assert services[name]["restart"] == "unless-stopped", name
    shipped = (ROOT / "ops" / "redis" / "sentinel.conf").read_text()
    timings = re.findall(r"^(sentinel (?:down-after-milliseconds|failover-timeout|"
                         r"parallel-syncs) leafpool \d+)$", shipped, re.M)
    assert len(timings) == 3
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        script = unescape(services[name]["command"][-1])
        assert "sentinel monitor leafpool redis-ha-master 6379 2" in script
        assert "redis-server /tmp/sentinel.conf --sentinel" in script
        for line in timings:
            assert line in script, line
        debug = " ".join(shipped_sentinel_debug())
        # set as the sentinels' own user (its password from the environment), and seen
        # set: redis-cli exits 0 on a refusal too
        assert ('[ "$(REDISCLI_AUTH="$REDIS_SENTINEL_PASSWORD" redis-cli --user '
                f'leafpool-sentinel -p 26379 SENTINEL DEBUG {debug} 2>/dev/null)" = OK ]'
                ) in script
        # the sentinels log in to the data nodes as leafpool-sentinel
        assert "sentinel auth-user leafpool leafpool-sentinel" in script
        assert 'sentinel auth-pass leafpool "%s"' in script
        # the sentinels ask for a login: default user off, leafpool's and their own users
        # with acl.py's rules (their passwords as SHA-256), the peers' login between them
        assert "user default off\\n" in script
        assert f"user {acl.SENTINEL_PEER_USER} on #%s {acl.SENTINEL_PEER_RULES}\\n" in script
        assert (f"user {acl.SENTINEL_CLIENT_USER} on #%s {acl.SENTINEL_CLIENT_RULES}\\n"
                in script)
        assert 'sentinel sentinel-user leafpool-sentinel\\nsentinel sentinel-pass "%s"' in script
        assert ('"$REDIS_SENTINEL_PASSWORD" "$REDIS_SENTINEL_PASSWORD" '
                '"$(hash "$REDIS_SENTINEL_PASSWORD")" "$(hash "$LEAFPOOL_REDIS_SENTINEL_PASSWORD")"'
                ' > /tmp/sentinel.conf') in script
        env = services[name]["environment"]
        assert env["REDIS_SENTINEL_PASSWORD"] == "dummy-sentinel"
        assert env["LEAFPOOL_REDIS_SENTINEL_PASSWORD"] == "dummy-sentinel-client"
        check = " ".join(services[name]["healthcheck"]["test"])
        assert ('REDISCLI_AUTH="$$LEAFPOOL_REDIS_SENTINEL_PASSWORD" redis-cli --user '
                f"{acl.SENTINEL_CLIENT_USER} -p 26379 sentinel master leafpool") in check
    for name in ("redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2"):  # to their master
        script = unescape(services[name]["command"][-1])
        assert "masteruser leafpool-replication" in script and "--include " in script
        assert services[name]["environment"]["REDIS_REPLICATION_PASSWORD"] == (
            "dummy-replication")
    for name in ("segment-worker-ha", "http-ha"):
        env = services[name]["environment"]
        settings = Settings(**{k.removeprefix("LEAFPOOL_").lower(): v for k, v in env.items()
                               if k.startswith("LEAFPOOL_") and v != ""
                               and not k.startswith("LEAFPOOL_DATABASE_")})
        assert settings.redis_topology == "sentinel" and settings.pop_replicas == "all"
        assert [h for h, _ in settings.sentinels] == ["sentinel-1", "sentinel-2", "sentinel-3"]
        # logged in to the sentinels as leafpool's sentinel user, pools and broker
        login = {"username": acl.SENTINEL_CLIENT_USER, "password": "dummy-sentinel-client"}
        assert settings.sentinel_login.redis_options() == login
        assert settings.broker_options == {"master_name": "leafpool",
                                           "sentinel_kwargs": {**SENTINEL_TIMEOUTS, **login}}
    # the worker's Celery: over the same sentinels as the worker role, on the broker
    # database the ACL file names (the HTTP service sends no task)
    broker = services["segment-worker-ha"]["environment"]["LEAFPOOL_BROKER_URL"]
    worker = f"leafpool-worker:{SECRETS['LEAFPOOL_ACL_WORKER_PASSWORD']}"
    assert broker.split(";") == [f"sentinel://{worker}@sentinel-{i}:26379/1" for i in (1, 2, 3)]


# -- the secure default (issue 18) ----------------------------------------------------------

def _urls(env: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k in ("LEAFPOOL_REDIS_URL", "LEAFPOOL_BROKER_URL") and v}


def test_every_leafpool_service_logs_in_to_redis_as_its_role_and_holds_no_other_password(
    services: dict[str, Any],
) -> None:
    image = {n for n, svc in services.items() if svc.get("image") == "leafpool:latest"}
    assert image - {"redis-acl", "db-tls"} == set(ROLE_OF), "a leafpool service without a role"
    for name, role in ROLE_OF.items():
        env = services[name]["environment"]
        urls = _urls(env)
        assert "LEAFPOOL_REDIS_URL" in urls, name
        for variable, url in urls.items():
            for part in url.split(";"):
                split = urlsplit(part)
                assert (split.username, split.password) == (
                    f"leafpool-{role}", SECRETS[f"LEAFPOOL_ACL_{role.upper()}_PASSWORD"]), (
                    name, variable)
        text = " ".join(str(v) for v in env.values())
        assert [r for r in ROLES if f"dummy-{r}" in text] == [role], name
        assert "REDISCLI_AUTH" not in env, name
        assert ("FLOWER_BASIC_AUTH" in env) == (name == "flower"), name


def test_redis_loads_the_acl_file_with_protected_mode_on_on_every_data_node(
    services: dict[str, Any],
) -> None:
    for name, svc in services.items():
        command = unescape(" ".join(svc.get("command") or []))
        assert not re.search(r"protected-mode\W+no", command), name
    for name in DATA_NODES:
        command = unescape(" ".join(services[name]["command"]))
        assert f"--aclfile {ACL_FILE}" in command, name
        assert re.search(r"--protected-mode\W+yes", command), name
        assert _mounts(services[name])["/etc/redis-acl"] == "redis-acl", name
        assert any(v.endswith(":/etc/redis-acl:ro") for v in services[name]["volumes"]
                   if isinstance(v, str)), f"{name}: the ACL file read-only"
        assert services[name]["depends_on"].get("redis-acl", {"condition": "ha"})[
            "condition"] in ("service_completed_successfully", "ha"), name
        # the health check logs in as the monitor role
        check = " ".join(services[name]["healthcheck"]["test"])
        assert "redis-cli --user leafpool-monitor ping" in check, name
        assert services[name]["environment"]["REDISCLI_AUTH"] == SECRETS[
            "LEAFPOOL_ACL_MONITOR_PASSWORD"]
    assert services["redis"]["depends_on"]["redis-acl"]["condition"] == (
        "service_completed_successfully")
    assert services["redis-ha-master"]["depends_on"]["redis-acl"]["condition"] == (
        "service_completed_successfully")


def test_the_acl_file_is_written_by_leafpool_redis_acl_with_the_default_user_off(
    services: dict[str, Any],
) -> None:
    acl = services["redis-acl"]
    script = unescape(acl["command"][-1])
    assert "leafpool redis acl --disable-default >" in script
    assert ACL_FILE in script and _mounts(acl)["/etc/redis-acl"] == "redis-acl"
    for role in ROLES:  # every role's password, as given
        variable = f"LEAFPOOL_ACL_{role.upper()}_PASSWORD"
        assert acl["environment"][variable] == SECRETS[variable]
    # the channels the ACL file names are those of the workers' broker database
    db = urlsplit(acl["environment"]["LEAFPOOL_BROKER_URL"]).path
    for name, role in ROLE_OF.items():
        broker = services[name]["environment"].get("LEAFPOOL_BROKER_URL")
        if role == "worker":
            assert broker and all(urlsplit(u).path == db for u in broker.split(";")), name


def test_every_leafpool_service_reaches_mysql_over_tls_only_and_verifies_it(
    services: dict[str, Any], resolved: dict[str, Any]
) -> None:
    """MySQL speaks TLS only over the network (require_secure_transport) with db-tls's
    certificate; every service of the leafpool image that loads the settings verifies it
    against the CA (hostname checked), mounted read-only from a volume that holds the CA's
    certificate alone; tests/system/test_compose_database.py runs both sides."""
    mysql = services["mysql"]
    assert mysql["command"] == ["--ssl-ca=/etc/mysql/tls/ca.crt",
                                "--ssl-cert=/etc/mysql/tls/server.crt",
                                "--ssl-key=/etc/mysql/tls/server.key",
                                "--require-secure-transport=ON"]
    assert "db-tls-server:/etc/mysql/tls:ro" in mysql["volumes"]
    assert mysql["depends_on"]["db-tls"]["condition"] == "service_completed_successfully"
    tls = services["db-tls"]
    assert tls["command"] == ["python", "/opt/leafpool/make-tls.py", "/tls/server", "/tls/ca",
                              "mysql", "999"]
    script = Path(_mounts(tls)["/opt/leafpool/make-tls.py"])
    assert script == ROOT / "ops" / "mysql" / "make-tls.py" and script.is_file()
    assert _mounts(tls)["/tls/server"] == "db-tls-server"
    assert _mounts(tls)["/tls/ca"] == "db-tls-ca"
    assert {"db-tls-server", "db-tls-ca"} <= set(resolved["volumes"])
    with_settings = {n for n, svc in services.items()
                     if "LEAFPOOL_DATABASE_URL" in svc.get("environment", {})}
    assert with_settings == set(ROLE_OF)
    for name in with_settings:
        env = services[name]["environment"]
        assert env["LEAFPOOL_DATABASE_TLS"] == "true", name
        assert env["LEAFPOOL_DATABASE_TLS_CA_FILE"] == "/etc/leafpool/db-tls/ca.crt", name
        assert "LEAFPOOL_DATABASE_TLS_CHECK_HOSTNAME" not in env, name  # checked: mysql
        assert "db-tls-ca:/etc/leafpool/db-tls:ro" in services[name]["volumes"], name
        # the CA is there before the settings load
        deps = services[name].get("depends_on", {})
        assert "db-tls" in deps or "mysql" in deps or "migrate" in deps, name


def test_zookeeper_asks_for_a_login_and_only_the_services_claiming_worker_ids_hold_it(
    services: dict[str, Any],
) -> None:
    """ZooKeeper closes a session that does not log in (enforce.auth, through the image's
    ZOO_CFG_EXTRA); the services that claim worker IDs log in as leafpool, whose nodes are
    its alone (tests/snowflake/registry/test_zk_acl.py runs both on a real ZooKeeper)."""
    extra = services["zookeeper"]["environment"]["ZOO_CFG_EXTRA"].split()
    assert extra == ["enforce.auth.enabled=true", "enforce.auth.schemes=digest"]
    holders = {name for name, svc in services.items()
               if "LEAFPOOL_ZK_PASSWORD" in svc.get("environment", {})}
    assert holders == {"snowflake-worker", "segment-worker-ha"}
    for name in holders:
        env = services[name]["environment"]
        assert env["LEAFPOOL_ZK_USERNAME"] == "leafpool"
        assert env["LEAFPOOL_ZK_PASSWORD"] == SECRETS["LEAFPOOL_ZK_PASSWORD"]
        login = Settings(zk_hosts=env["LEAFPOOL_ZK_HOSTS"], zk_username="leafpool",
                         zk_password=env["LEAFPOOL_ZK_PASSWORD"]).zk_login
        assert login.digest() == f"leafpool:{SECRETS['LEAFPOOL_ZK_PASSWORD']}"
    for name, svc in services.items():  # no other service holds the password
        if name not in holders:
            assert "dummy-zookeeper" not in str(svc.get("environment", {})), name


def test_published_ports_listen_on_loopback_only(services: dict[str, Any]) -> None:
    published = {name: svc["ports"] for name, svc in services.items() if svc.get("ports")}
    assert {"http", "flower", "http-ha", "prometheus", "grafana"} <= set(published)
    for name, ports in published.items():
        for port in ports:
            text = port if isinstance(port, str) else f"{port['host_ip']}:{port['published']}"
            assert text.startswith("127.0.0.1:"), (name, port)


def test_flower_asks_for_basic_auth_and_its_healthcheck_needs_none(
    services: dict[str, Any],
) -> None:
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == SECRETS["FLOWER_BASIC_AUTH"]
    assert not any("basic" in part for part in flower["command"])  # not on a command line
    # Flower 2.2 serves /healthcheck without authentication (flower/views/monitor.py);
    # tests/system/test_flower_secrets.py runs it
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"])


@pytest.mark.parametrize("variable", sorted(SECRETS))
def test_a_missing_secret_stops_compose_naming_it(variable: str, tmp_path: Path) -> None:
    done = compose(tmp_path, {k: v for k, v in SECRETS.items() if k != variable})
    assert done.returncode != 0
    assert f"set {variable}" in done.stderr, done.stderr


def test_the_ha_secrets_are_needed_by_the_ha_profile_only(tmp_path: Path) -> None:
    config = compose_config(tmp_path, SECRETS)  # `docker compose up` without them
    services = config["services"]
    for name, variable in [("redis-ha-master", "REDIS_REPLICATION_PASSWORD"),
                           ("redis-ha-replica-1", "REDIS_REPLICATION_PASSWORD"),
                           ("redis-ha-replica-2", "REDIS_REPLICATION_PASSWORD"),
                           ("sentinel-1", "REDIS_SENTINEL_PASSWORD"),
                           ("sentinel-1", "LEAFPOOL_REDIS_SENTINEL_PASSWORD")]:
        assert "ha" in services[name]["profiles"]
        script = unescape(services[name]["command"][-1])
        # the node refuses to start without it, naming it (before anything else)
        checks = script.split("umask", 1)[0]
        assert f': "${{{variable}:?set {variable} in .env' in checks, name
        assert services[name]["environment"][variable] == ""


def test_prometheus_gets_the_alert_rules_its_config_loads(services: dict[str, Any]) -> None:
    """ops/prometheus/prometheus.yml loads alerts.yml beside it: compose mounts both."""
    config = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    mounted = {str(v.get("target") if isinstance(v, dict) else v.split(":")[1])
               for v in services["prometheus"]["volumes"]}
    for rules in config["rule_files"]:
        assert f"/etc/prometheus/{rules}" in mounted, mounted
