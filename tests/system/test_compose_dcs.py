"""Two data centers with docker compose (issue 31; docs/how-to/multiple-dcs.md,
docs/design.md §12): docker-compose.yml with docker-compose.dc-b.yml, resolved by Debian's
docker-compose (`config`: no engine, no container started).

- Every leafpool service of both DCs gets LEAFPOOL_DC_COUNT=2 and LEAFPOOL_DC_SEGMENTS=shared,
  DC a's LEAFPOOL_DC_ID=0 and DC b's 1; each leafpool process's settings are accepted by
  leafpool's own validation.
- DC b is DC a but for what must differ: each of its services is its DC a counterpart with
  DC b's Redis, ZooKeeper, volumes, DC ID and published port; so it runs the same
  commands, healthchecks and settings, and a setting added to DC a and forgotten in DC b
  fails here.
- The DCs share the database (mode shared) and nothing else: each leafpool service talks
  to its own DC's Redis and ZooKeeper; the two snowflake workers' worker IDs, as leafpool's
  k8s mode computes them, lie in their DCs' ranges (0 and 512); published ports do not
  collide.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from leafpool.core.config import load_settings
from leafpool.snowflake.registry.k8s import pod_worker_id
from tests.support.services import missing
from tests.system.test_compose import COMPOSE, HA_SECRETS, ROOT, SECRETS

DC_B_FILE = ROOT / "docker-compose.dc-b.yml"
#: DC a's services and their DC b counterparts
PAIRS = {"redis": "redis-b", "zookeeper": "zookeeper-b", "segment-worker": "segment-worker-b",
         "snowflake-worker": "snowflake-worker-b", "beat": "beat-b", "http": "http-b",
         "admin": "admin-b"}
#: the one-shots of the leafpool image that load no DC-dependent setting: the ACL file and
#: MySQL's certificates
ONE_SHOTS = {"redis-acl", "db-tls"}
DC_A = {"LEAFPOOL_DC_ID": "0", "LEAFPOOL_DC_COUNT": "2", "LEAFPOOL_DC_SEGMENTS": "shared"}
DC_B = {**DC_A, "LEAFPOOL_DC_ID": "1"}
#: what DC b's names are in DC a (volumes, hosts, services)
RENAMED = ("redis", "zookeeper", "redis-data", "zookeeper-data", "zookeeper-datalog",
           "snowflake-cache", "beat-data")
WORKER_IDS = 1024
Services = dict[str, Any]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Services:
    """Both files as docker-compose resolves them, with every secret set (the tests'
    dummies) and nothing else: no developer's .env or shell variable leaks in."""
    binary = shutil.which("docker-compose")
    if binary is None:
        missing("docker-compose (Debian package docker-compose)")
    assert binary
    empty = tmp_path_factory.mktemp("compose-dcs") / "empty.env"
    empty.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("LEAFPOOL_", "MYSQL_", "COMPOSE_", "REDIS_", "FLOWER_"))}
    done = subprocess.run([binary, "-f", str(COMPOSE), "-f", str(DC_B_FILE), "--env-file",
                           str(empty), "config"], cwd=ROOT, capture_output=True, text=True,
                          env={**base, **SECRETS, **HA_SECRETS}, timeout=60)
    assert done.returncode == 0, done.stderr
    result: Services = yaml.safe_load(done.stdout)["services"]
    return result


def leafpool_services(services: Services) -> dict[str, Any]:
    """The services running leafpool with its settings (the image, but the one-shots)."""
    return {name: svc for name, svc in services.items()
            if str(svc.get("image", "")).startswith("leafpool:") and name not in ONE_SHOTS}


def dc_of(name: str) -> str:
    return "b" if name.endswith("-b") else "a"


#: files inside the container (the CA volume's), not here
IN_CONTAINER = {"LEAFPOOL_DATABASE_TLS", "LEAFPOOL_DATABASE_TLS_CA_FILE"}


def settings_of(env: dict[str, Any], **more: str) -> Any:
    """leafpool's settings from a service's variables, validated as its process would
    (but for the files only its container has)."""
    values = {k.removeprefix("LEAFPOOL_").lower(): str(v) for k, v in {**env, **more}.items()
              if k.startswith("LEAFPOOL_") and k not in IN_CONTAINER}
    return load_settings(**values)


def hosts(svc: dict[str, Any]) -> set[str]:
    """The Redis and ZooKeeper hosts a service's settings name."""
    env = svc.get("environment", {})
    found = set(re.findall(r"@([\w-]+):\d+", " ".join(
        str(env.get(k, "")) for k in ("LEAFPOOL_REDIS_URL", "LEAFPOOL_BROKER_URL"))))
    found |= {h.split(":")[0] for h in str(env.get("LEAFPOOL_ZK_HOSTS", "")).split(",") if h}
    found |= {h.split(":")[0] for h in str(env.get("LEAFPOOL_REDIS_SENTINELS", "")).split(",")
              if h}
    return found


def in_dc_b(svc: dict[str, Any]) -> dict[str, Any]:
    """A DC a service as its DC b counterpart must read: DC b's hosts, volumes and DC ID."""
    text = json.dumps(svc)
    for name in RENAMED:  # a host:port, or a volume's name:/path
        text = re.sub(rf"(?<![\w-]){re.escape(name)}(?=:\d{{4}}\b|:/(?!/))", f"{name}-b", text)
    out: dict[str, Any] = json.loads(text)
    if "depends_on" in out:
        out["depends_on"] = {f"{k}-b" if k in RENAMED else k: v
                             for k, v in out["depends_on"].items()}
    if "LEAFPOOL_DC_ID" in out.get("environment", {}):
        out["environment"]["LEAFPOOL_DC_ID"] = DC_B["LEAFPOOL_DC_ID"]
    return out


def published(services: Services) -> dict[str, list[str]]:
    """Each service's published host addresses, 127.0.0.1:PORT."""
    out = {}
    for name, svc in services.items():
        out[name] = [p if isinstance(p, str) and p.count(":") == 1 else
                     (f"{p['host_ip']}:{p['published']}" if isinstance(p, dict)
                      else p.rsplit(":", 1)[0]) for p in svc.get("ports", [])]
    return out


# -- the checks: each returns what is wrong, so an unsafe variant can be shown failing ----

def dc_settings_wrong(services: Services) -> list[str]:
    wrong = []
    for name, svc in leafpool_services(services).items():
        env = svc.get("environment", {})
        want = DC_B if dc_of(name) == "b" else DC_A
        for key, value in want.items():
            if str(env.get(key)) != value:
                wrong.append(f"{name}: {key}={env.get(key)!r}, not {value!r}")
    return wrong


def shared_wrong(services: Services) -> list[str]:
    """A leafpool service reaching the other DC's Redis or ZooKeeper, or another
    database than the one both DCs share."""
    wrong = []
    own = {"a": {"redis", "zookeeper", "sentinel-1", "sentinel-2", "sentinel-3",
                 "redis-ha-master"},
           "b": {"redis-b", "zookeeper-b"}}
    databases = set()
    for name, svc in leafpool_services(services).items():
        foreign = hosts(svc) - own[dc_of(name)]
        if foreign:
            wrong.append(f"{name}: reaches {sorted(foreign)}, not DC {dc_of(name)}'s")
        databases.add(svc["environment"].get("LEAFPOOL_DATABASE_URL"))
    if len(databases) != 1:
        wrong.append(f"the DCs' database URLs differ: {sorted(map(str, databases))}")
    return wrong


def worker_ids_wrong(services: Services) -> list[str]:
    wrong: list[str] = []
    seen: dict[int, str] = {}
    for name in ("snowflake-worker", "snowflake-worker-b"):
        settings = settings_of(services[name]["environment"])
        worker_id = pod_worker_id(settings, name)
        size = WORKER_IDS // settings.dc_count
        first = settings.dc_id * size
        if not first <= worker_id < first + size:
            wrong.append(f"{name}: worker ID {worker_id} outside DC {settings.dc_id}'s "
                         f"range {first}..{first + size - 1}")
        if worker_id in seen:
            wrong.append(f"{name}: worker ID {worker_id} also {seen[worker_id]}'s")
        seen[worker_id] = name
    return wrong


# -- the tests --------------------------------------------------------------------------

def test_every_leafpool_service_of_both_dcs_gets_its_dc_s_settings(services: Services) -> None:
    assert dc_settings_wrong(services) == []
    leafpool = leafpool_services(services)
    assert set(PAIRS.values()) - {"redis-b", "zookeeper-b"} <= set(leafpool)
    for name, svc in leafpool.items():
        settings = settings_of(svc["environment"])  # accepted, as the process does
        assert settings.dc_id == (1 if dc_of(name) == "b" else 0), name
        assert (settings.dc_count, settings.dc_segments) == (2, "shared"), name


def test_dc_b_is_dc_a_but_for_what_must_differ(services: Services) -> None:
    for a, b in PAIRS.items():
        want, got = in_dc_b(services[a]), copy.deepcopy(services[b])
        if a == "http":  # DC b's HTTP service beside DC a's on the host
            assert published({b: got})[b] == ["127.0.0.1:8082"]
            want.pop("ports"), got.pop("ports")
        assert got == want, b


def test_the_dcs_share_the_database_and_nothing_else(services: Services) -> None:
    assert shared_wrong(services) == []
    assert worker_ids_wrong(services) == []
    ids = [pod_worker_id(settings_of(services[n]["environment"]), n)
           for n in ("snowflake-worker", "snowflake-worker-b")]
    assert ids == [0, 512]
    ports = [p for addresses in published(services).values() for p in addresses]
    assert len(ports) == len(set(ports)), ports
    assert all(p.startswith("127.0.0.1:") for p in ports), ports
    volumes = {b: {str(v).split(":")[0] for v in services[b].get("volumes", [])}
               for b in PAIRS.values()}
    assert volumes["redis-b"] & {"redis-data"} == set()
    assert "snowflake-cache-b" in volumes["snowflake-worker-b"]


def test_the_checks_catch_an_unsafe_variant(services: Services) -> None:
    """DC b's snowflake worker left at DC a's DC ID takes DC a's worker ID; a DC b worker
    pointed at DC a's Redis, or at another database, is reported."""
    bad = copy.deepcopy(services)
    bad["snowflake-worker-b"]["environment"]["LEAFPOOL_DC_ID"] = "0"
    assert "snowflake-worker-b: LEAFPOOL_DC_ID='0', not '1'" in dc_settings_wrong(bad)
    assert "snowflake-worker-b: worker ID 0 also snowflake-worker's" in worker_ids_wrong(bad)
    env = bad["segment-worker-b"]["environment"]
    env["LEAFPOOL_BROKER_URL"] = env["LEAFPOOL_BROKER_URL"].replace("@redis-b:", "@redis:")
    bad["http-b"]["environment"]["LEAFPOOL_DATABASE_URL"] += "_b"
    wrong = shared_wrong(bad)
    assert "segment-worker-b: reaches ['redis'], not DC b's" in wrong
    assert any(w.startswith("the DCs' database URLs differ") for w in wrong)


def test_the_dc_b_file_alone_is_not_a_stack(tmp_path: Path) -> None:
    """DC b's file is an override: docker-compose refuses it without docker-compose.yml
    (its services name DC a's mysql and migrate), so DC b never runs without the database."""
    binary = shutil.which("docker-compose")
    if binary is None:
        missing("docker-compose (Debian package docker-compose)")
    assert binary
    empty = tmp_path / "empty.env"
    empty.write_text("")
    done = subprocess.run([binary, "-f", str(DC_B_FILE), "--env-file", str(empty), "config"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith(("LEAFPOOL_", "MYSQL_", "COMPOSE_"))},
                               **SECRETS})
    assert done.returncode != 0
    assert "mysql" in done.stderr or "migrate" in done.stderr or "image" in done.stderr, \
        done.stderr
