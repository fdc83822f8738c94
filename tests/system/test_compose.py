"""docker-compose.yml and the Dockerfile: validated by Debian's docker-compose
(`docker-compose config`, no Docker engine needed) and checked for what a production-like
start needs: every service, healthchecks, depends_on conditions, volumes, settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from leafpool.core.config import Settings
from tests.support.services import missing

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CORE = {"mysql", "redis", "zookeeper", "segment-worker", "snowflake-worker", "beat", "flower",
        "http"}
LEAFPOOL_SERVICES = {"segment-worker", "snowflake-worker", "beat", "flower", "http"}


def _compose_config() -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    if binary is None:
        missing("docker-compose (Debian package docker-compose)")
    assert binary
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEAFPOOL_", "MYSQL_", "COMPOSE_"))}
    done = subprocess.run([binary, "-f", str(COMPOSE), "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors, merges, variables applied)."""
    return _compose_config()


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
        assert env["LEAFPOOL_REDIS_URL"] == "redis://redis:6379/0"
        assert env["LEAFPOOL_DATABASE_URL"].startswith("mysql+pymysql://leaf:")
        assert env["LEAFPOOL_DATABASE_URL"].endswith("@mysql:3306/leaf")
        assert env["LEAFPOOL_ZK_HOSTS"] == "zookeeper:2181"
    assert services["http"]["environment"]["LEAFPOOL_HTTP_HOST"] == "0.0.0.0"


def test_raw_file_parses_and_dockerfile_installs_the_package() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    assert set(raw["services"]) >= CORE
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert 'pip install ".[monitor]"' in dockerfile
    for path in ("pyproject.toml", "leafpool", "workers"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", dockerfile, re.M), path
        assert (ROOT / path).exists()


def test_the_ha_profile_runs_a_master_a_replica_three_sentinels_and_follows_them(
    services: dict[str, Any],
) -> None:
    ha = {name for name, svc in services.items() if "ha" in svc.get("profiles", [])}
    assert ha == {"redis-ha-master", "redis-ha-replica", "sentinel-1", "sentinel-2",
                  "sentinel-3", "segment-worker-ha", "http-ha"}
    assert services["redis-ha-replica"]["command"][-3:] == ["--replicaof", "redis-ha-master",
                                                           "6379"]
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        script = services[name]["command"][-1]
        assert "sentinel monitor leafpool redis-ha-master 6379 2" in script
        assert script.rstrip().endswith("--sentinel")
    for name in ("segment-worker-ha", "http-ha"):
        env = services[name]["environment"]
        settings = Settings(**{k.removeprefix("LEAFPOOL_").lower(): v for k, v in env.items()
                               if k.startswith("LEAFPOOL_") and v != ""
                               and k != "LEAFPOOL_DATABASE_URL"})
        assert settings.redis_topology == "sentinel" and settings.pop_replicas == "1"
        assert [h for h, _ in settings.sentinels] == ["sentinel-1", "sentinel-2", "sentinel-3"]
        assert settings.broker_url.startswith("sentinel://sentinel-1:26379/0;")
        assert settings.broker_options == {"master_name": "leafpool"}
