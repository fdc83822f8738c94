"""docker-compose.yml run for real (issue 27, item 3): the default profile and ``--profile
ha`` brought up together, from the image the suite builds and the stand-in service images
(tests/support/containers.py, ops/images/), by Debian's docker-compose against podman's
Docker API, with the dummy secrets of tests/system/test_compose.py in place of an .env.

- The default profile serves IDs: a tag registered as the README says (`docker compose run
  --rm admin leafpool tag add order --step 1000`) is served through the published HTTP port
  (127.0.0.1:8080) and through a plain ``LPOP`` under the application's Redis role; a
  snowflake tag is served too (the snowflake worker holds worker 0 in ZooKeeper).
- A SIGKILLed segment worker container is restarted by its restart policy and refills an
  emptied pool; no ID is handed out twice.
- ``--profile ha`` survives a SIGKILL of the master's container with no ID repeated:
  pops go on through http-ha (127.0.0.1:8081) before and after it; the killed node is
  restarted and the group ends with one master and two connected replicas. With the
  restart policy the master is usually back before Sentinel's down-after (5 s), so what
  this covers is a crashed master that returns holding every pop it acknowledged
  (appendfsync always); Sentinel's failover itself is covered on loopback
  (tests/system/test_sentinel_failover.py, test_nemesis.py).
- ``down -v`` leaves no container, volume or network.

What of the official images' contracts this relies on, and so covers in the stand-ins
(ops/images/*/Containerfile): MySQL's MYSQL_DATABASE, MYSQL_USER, MYSQL_PASSWORD and
MYSQL_ROOT_PASSWORD, its /docker-entrypoint-initdb.d/*.sql run once into that database by
a socket-only temporary server (the healthcheck over 127.0.0.1 passes only after it),
mysqladmin; Redis's docker-entrypoint.sh (the ha nodes run it themselves), /data, protected
mode off unless set (the sentinels take clients from the network), redis-cli with
REDISCLI_AUTH; ZooKeeper's ZOO_4LW_COMMANDS_WHITELIST (``zkServer.sh status`` is its health
check: srvr), /data and /datalog.

Podman 4.3 runs health checks from systemd timers; with none here,
:class:`tests.support.containers.HealthChecks` runs them at their intervals, which
docker-compose's ``depends_on: condition: service_healthy`` waits for.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import yaml

from tests.support import containers as c
from tests.support.services import port_open, unavailable, wait_until
from tests.system.test_compose import HA_SECRETS, SECRETS

# the first test to use the images builds them: 6 min on a machine without the cache
# one xdist worker runs every container test (./dev test -n): one image build, one podman
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("containers")]
pytest_plugins = ["tests.support.container_fixtures"]

HTTP = "http://127.0.0.1:8080"
PUBLISHED = (8080, 8081, 5555)  # the file's ports on the host's loopback
HTTP_HA = "http://127.0.0.1:8081"
APP = ("leafpool-app", SECRETS["LEAFPOOL_ACL_APP_PASSWORD"])
MONITOR = ("leafpool-monitor", SECRETS["LEAFPOOL_ACL_MONITOR_PASSWORD"])
HA_NODES = ("redis-ha-master", "redis-ha-replica-1", "redis-ha-replica-2")
ADMIN_PASSWORD = SECRETS["LEAFPOOL_ACL_ADMIN_PASSWORD"]


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def collect(into: list[int], url: str) -> bool:
    """One GET's IDs added to ``into``; whether it holds any now."""
    into.extend(ids_from(url))
    return bool(into)


def ids_from(url: str) -> list[int]:
    """The IDs one GET hands out; none when it answers an error."""
    try:
        status, body = get(url)
    except OSError:
        return []
    return [int(line) for line in body.split()] if status == 200 else []


@dataclass
class Stack:
    compose: c.Compose
    podman: c.Podman
    started_in: float
    handed_out: list[int] = field(default_factory=list)  # every segment ID seen, in order

    def redis_cli(self, service: str, user: tuple[str, str], *args: str) -> str:
        """redis-cli in the service's container, logged in as ``user`` (name, password)."""
        done = self.compose("exec", "-T", "-e", f"REDISCLI_AUTH={user[1]}", service,
                            "redis-cli", "--user", user[0], *args, timeout=60)
        return done.stdout.strip()

    def admin(self, script: str) -> str:
        """``docker compose run --rm admin sh -c SCRIPT``: the CLI under the admin role (one
        run for several commands: each run starts the one-shot services again)."""
        return self.compose("run", "--rm", "-T", "admin", "sh", "-c", script,
                            timeout=240).stdout

    def restarts(self, service: str) -> int:
        (info,) = self.podman.inspect(self.compose.container(service))
        return int(info.get("RestartCount", 0))

    def sigkill(self, service: str) -> None:
        """SIGKILL the container's main process, as a crash (``podman kill`` would count as
        stopped by the user, and no restart policy restarts that)."""
        os.kill(self.podman.pid(self.compose.container(service)), signal.SIGKILL)

    def running_again(self, service: str, restarts_before: int) -> bool:
        (info,) = self.podman.inspect(self.compose.container(service))
        return bool(info["State"]["Running"]) and int(info.get("RestartCount", 0)) > \
            restarts_before


@pytest.fixture(scope="module")
def stack(podman: c.Podman, images: c.BuildReport,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("compose-stack")
    api = c.ApiService(podman, workdir / "podman-service.log")
    health = c.HealthChecks(podman).start()
    try:
        compose = c.Compose(api, f"lpt{os.getpid()}", {**SECRETS, **HA_SECRETS}, workdir,
                            profiles=["ha"])
    except c.Unavailable as exc:
        health.stop()
        api.stop()
        unavailable(str(exc))
    for port in PUBLISHED:
        if port_open(port):
            health.stop()
            api.stop()
            pytest.fail(f"127.0.0.1:{port} is taken (docker-compose.yml publishes it): stop "
                        "what listens there (`./dev up`?) and run again")
    started = time.monotonic()
    try:
        compose("up", "--detach", "--no-build", timeout=900)
        wait_until(lambda: get(f"{HTTP}/health")[0] == 200, 180, "the http service's /health")
        wait_until(lambda: get(f"{HTTP_HA}/readyz")[0] == 200, 120, "http-ha's /readyz")
        stack = Stack(compose, podman, time.monotonic() - started)
        print(f"compose stack (default + ha) up and serving in {stack.started_in:.1f} s")
        # the README's `docker compose run --rm admin leafpool tag add order --step 1000`,
        # a snowflake tag, and a tag on the ha group's Redis: the admin role through the
        # sentinels, with the Sentinel settings http-ha has (and its login to them, if any)
        http_ha = yaml.safe_load(compose("config").stdout)["services"]["http-ha"]
        ha_env = {k: str(v) for k, v in http_ha["environment"].items()
                  if k.startswith("LEAFPOOL_REDIS_SENTINEL") or k == "LEAFPOOL_REDIS_MASTER_NAME"}
        ha_env["LEAFPOOL_REDIS_URL"] = f"redis://leafpool-admin:{ADMIN_PASSWORD}@redis-ha-master/0"
        as_ha = " ".join(f"{k}={shlex.quote(v)}" for k, v in ha_env.items())
        added = stack.admin(
            "leafpool tag add order --step 1000 && leafpool tag add flake --mode snowflake && "
            f"{as_ha} leafpool tag add ha --step 1000")
        assert ("order: added" in added and "flake: added" in added
                and "ha: added" in added), added
        # docker-compose waits on health only in `up` and `run`: the tests run the checks
        # themselves (test_every_running_service_passes_its_healthcheck)
        health.stop()
        yield stack
    finally:
        compose("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False,
                timeout=300)
        health.stop()
        api.stop()


def test_the_default_profile_serves_ids_over_http_and_a_plain_lpop(stack: Stack) -> None:
    over_http: list[int] = []
    wait_until(lambda: collect(over_http, f"{HTTP}/api/segment/get/order"), 60,
               "an ID of tag order over HTTP")
    popped = stack.redis_cli("redis", APP, "LPOP", "leafpool:{order}:ids")
    assert popped.isdigit(), popped
    assert int(popped) not in over_http
    stack.handed_out += [*over_http, int(popped)]
    # the snowflake worker (worker 0, leased in ZooKeeper) fills the snowflake tag
    flakes: list[int] = []
    wait_until(lambda: collect(flakes, f"{HTTP}/api/snowflake/get/flake"), 60,
               "an ID of the snowflake tag over HTTP")
    status, body = get(f"{HTTP}/api/snowflake/decode/{flakes[0]}")
    assert status == 200, body
    assert json.loads(body)["worker_id"] == 0


def healthcheck_passes(stack: Stack, service: str, test: list[str]) -> bool:
    """The service's healthcheck as compose writes it, run in its container as Docker runs
    it (CMD: the arguments as they are; CMD-SHELL: through sh -c)."""
    argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
    return stack.podman.exec(stack.compose.container(service), *argv).returncode == 0


def test_every_running_service_passes_its_healthcheck(stack: Stack) -> None:
    """Each healthcheck of the file, as `docker-compose config` resolves it, run as Docker
    runs it. (Podman's own status is wrong for some: its Docker API joins a CMD check's
    arguments and splits them again at spaces, breaking the `python -c "..."` checks, and
    its exec leaves HOSTNAME out, breaking the Celery pings: see Podman.exec.)"""
    services = yaml.safe_load(stack.compose("config").stdout)["services"]
    running = set(stack.podman("ps", "--format", "{{.Names}}").stdout.split())
    checks = {name: [part.replace("$$", "$") for part in spec["healthcheck"]["test"]]
              for name, spec in services.items()
              # the one-shots (redis-acl, migrate) have finished
              if spec.get("healthcheck") and stack.compose.container(name) in running}
    assert {"mysql", "redis", "zookeeper", "segment-worker", "snowflake-worker", "beat",
            "flower", "http", "redis-ha-master", "sentinel-1"} <= set(checks)

    def passes(name: str) -> None:
        wait_until(lambda: healthcheck_passes(stack, name, checks[name]), 120,
                   f"{name}'s healthcheck", interval=1)

    with ThreadPoolExecutor(4) as pool:  # each check a process or two in its container
        list(pool.map(passes, checks))


def test_a_killed_worker_container_is_restarted_and_refills(stack: Stack) -> None:
    if not stack.handed_out:
        pytest.skip("needs the tag the test above registered")
    before = stack.restarts("segment-worker")
    stack.sigkill("segment-worker")
    wait_until(lambda: stack.running_again("segment-worker", before), 60,
               "the segment worker's container restarted")
    # empty the pool: only the restarted worker can refill it (it may have begun already)
    drained = stack.redis_cli("redis", APP, "LPOP", "leafpool:{order}:ids", "100000")
    stack.handed_out += [int(x) for x in drained.split()]
    fresh: list[int] = []
    wait_until(lambda: collect(fresh, f"{HTTP}/api/segment/get/order"), 90,
               "an ID after the worker's restart")
    stack.handed_out += fresh
    assert min(fresh) > max(stack.handed_out[:-len(fresh)])
    assert len(set(stack.handed_out)) == len(stack.handed_out)


def _ha_roles(stack: Stack) -> dict[str, str]:
    roles = {}
    for node in HA_NODES:
        info = stack.redis_cli(node, MONITOR, "INFO", "replication")
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        roles[node] = fields.get("role", "?").strip()
        if roles[node] == "master":
            roles[node] += f" {fields.get('connected_slaves', '0').strip()}"
    return roles


def test_ha_survives_a_sigkill_of_the_master_with_no_id_repeated(stack: Stack) -> None:
    url = f"{HTTP_HA}/api/segment/get/ha?count=5"
    got: list[tuple[float, int]] = []
    stop = threading.Event()

    def client() -> None:  # bounded: stops when told, or after 3 minutes
        deadline = time.monotonic() + 180
        while not stop.is_set() and time.monotonic() < deadline:
            now = time.monotonic()
            got.extend((now, i) for i in ids_from(url))
            stop.wait(0.02)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(got) >= 50, 90, "IDs from http-ha")
        before = stack.restarts("redis-ha-master")
        killed_at = time.monotonic()
        stack.sigkill("redis-ha-master")
        wait_until(lambda: stack.running_again("redis-ha-master", before), 60,
                   "the killed master's container restarted")
        wait_until(lambda: sum(t > killed_at + 1 for t, _ in got) >= 50, 120,
                   "IDs from http-ha after the kill")
        # one master with both replicas connected, wherever Sentinel left it
        roles: dict[str, str] = {}

        def converged() -> bool:
            roles.update(_ha_roles(stack))
            return sorted(roles.values()) == ["master 2", "slave", "slave"]

        wait_until(converged, 60, "the ha group back to one master and two replicas")
    finally:
        stop.set()
        thread.join(timeout=30)
    ids = [i for _, i in got]
    assert len(set(ids)) == len(ids), "an ID was handed out twice"
    master = [node for node, role in roles.items() if role.startswith("master")]
    print(f"ha: {len(ids)} IDs, the master after the kill: {master}")


def test_down_v_leaves_no_container_volume_or_network(stack: Stack) -> None:
    stack.compose("down", "--volumes", "--timeout", "5", timeout=300)
    assert stack.podman.leftovers() == {}

