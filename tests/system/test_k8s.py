"""The Kubernetes manifests (ops/k8s; README, "Deploy" > "Kubernetes"): each overlay renders
with ``kubectl kustomize``; every object validates, strictly, against the Kubernetes JSON
schemas of the two newest minor versions kubernetes-validate knows (offline); checkov passes
on the rendered manifests with every skipped check justified; and what matters is asserted
directly: requests and limits on every container, non-root everywhere, read-only root
filesystems for leafpool's containers, no secret value in production, one beat, the
snowflake workers a StatefulSet with their worker ID from the pod index, PDBs and
NetworkPolicies in production, probes that mean something. The probes are then run as the
manifests write them against real processes: ``leafpool serve`` with the ConfigMap's
settings answers the liveness and readiness paths, the beat's readiness command says no
without the beat lock and yes with it, and ``leafpool probe snowflake`` exists.

kubectl is not a Debian package in bookworm (``./dev test`` cannot install it): without it
these tests skip saying so, under CI=true too; the machine image CI runs on has it.
kubernetes-validate and checkov come with the ``test`` extra: missing, they skip locally
and fail under CI=true.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.support.processes import Proc, leafpool_env, own_home
from tests.support.services import ROOT, free_port, port_open, unavailable, wait_until

K8S = ROOT / "ops" / "k8s"
OVERLAYS = ("dev", "production")
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
SECRET_NAMES = re.compile(r"(URL|PASSWORD|TOKENS?|AUTH)$")

Doc = dict[str, Any]


@dataclass
class Rendered:
    overlay: str
    path: Path  # the rendered manifests, one YAML stream
    docs: list[Doc]


@pytest.fixture(scope="module")
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        # not unavailable(): no Debian package provides kubectl in bookworm, so `./dev test`
        # cannot install it and CI=true must not fail for it (README, "Kubernetes")
        pytest.skip("kubectl is not installed (not a Debian package in bookworm; the "
                    "manifests are rendered with `kubectl kustomize`)")
    return found


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ops/k8s with the dev overlay's secret env files made by its own script."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("*.env"))
    made = subprocess.run(["sh", str(root / "overlays" / "dev" / "make-secrets.sh")],
                          capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    return root


def _render(kubectl: str, overlay_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl, "kustomize", str(overlay_dir)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def renders(kubectl: str, tree: Path) -> dict[str, Rendered]:
    """Each overlay rendered once."""
    out = {}
    for overlay in OVERLAYS:
        done = _render(kubectl, tree / "overlays" / overlay)
        assert done.returncode == 0, done.stderr
        path = tree / f"{overlay}.rendered.yaml"
        path.write_text(done.stdout)
        out[overlay] = Rendered(overlay, path, [d for d in yaml.safe_load_all(done.stdout) if d])
    return out


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, renders: dict[str, Rendered]) -> Rendered:
    return renders[request.param]


@pytest.fixture(scope="module")
def checkov_report(rendered: Rendered) -> dict[str, Any]:
    """checkov run once per overlay (it takes seconds) with the overlay's configuration;
    its caches (``~/.cache/checkov``, a lark cache in the temporary folder) in a directory
    removed after it, not in $HOME or /tmp."""
    exe = Path(sys.executable).with_name("checkov")
    if not exe.exists():
        unavailable("checkov is not installed (pip install -e '.[test]')")
    config = K8S / "checkov" / f"{rendered.overlay}.yaml"
    with tempfile.TemporaryDirectory(prefix="leafpool-checkov-") as scratch:
        done = subprocess.run([str(exe), "--config-file", str(config), "-f",
                               str(rendered.path), "-o", "json", "--skip-download"],  # offline
                              capture_output=True, text=True, timeout=300,
                              cwd=rendered.path.parent, env=own_home(Path(scratch)))
    report = json.loads(done.stdout)
    if isinstance(report, list):
        (report,) = [r for r in report if r.get("check_type") == "kubernetes"]
    assert isinstance(report, dict)
    return report


# -- what the checks read -----------------------------------------------------------------

def workloads(docs: list[Doc]) -> Iterator[Doc]:
    return (d for d in docs if d["kind"] in WORKLOAD_KINDS)


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def containers(doc: Doc) -> Iterator[Doc]:
    spec = pod_spec(doc)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def is_leafpool(container: Doc) -> bool:
    return str(container["image"]).split(":")[0].rsplit("/", 1)[-1] == "leafpool"


def where(doc: Doc, container: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']} container {container['name']}"


# -- the checks: each returns what is wrong, so an unsafe variant can be shown failing ----

def missing_resources(docs: list[Doc]) -> list[str]:
    wrong = []
    for doc in workloads(docs):
        for c in containers(doc):
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for what in ("cpu", "memory"):
                    if what not in res.get(part, {}):
                        wrong.append(f"{where(doc, c)}: no {part}.{what}")
    return wrong


def root_or_writable(docs: list[Doc]) -> list[str]:
    wrong = []
    for doc in workloads(docs):
        pod = pod_spec(doc).get("securityContext", {})
        for c in containers(doc):
            ctx = {**pod, **c.get("securityContext", {})}
            if ctx.get("runAsNonRoot") is not True or ctx.get("runAsUser", 0) == 0:
                wrong.append(f"{where(doc, c)}: may run as root")
            if ctx.get("allowPrivilegeEscalation") is not False:
                wrong.append(f"{where(doc, c)}: privilege escalation allowed")
            if "ALL" not in ctx.get("capabilities", {}).get("drop", []):
                wrong.append(f"{where(doc, c)}: capabilities not dropped")
            if ctx.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                wrong.append(f"{where(doc, c)}: no RuntimeDefault seccomp profile")
            if is_leafpool(c):
                if ctx.get("readOnlyRootFilesystem") is not True:
                    wrong.append(f"{where(doc, c)}: writable root filesystem")
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                if "/tmp" not in mounts:
                    wrong.append(f"{where(doc, c)}: no volume for /tmp")
    return wrong


def secret_values(docs: list[Doc]) -> list[str]:
    """Secrets held in the manifests rather than referenced."""
    wrong = []
    for doc in docs:
        if doc["kind"] == "Secret" and (doc.get("data") or doc.get("stringData")):
            wrong.append(f"Secret/{doc['metadata']['name']} holds values")
        if doc["kind"] == "ConfigMap":
            wrong += [f"ConfigMap/{doc['metadata']['name']}: {key}"
                      for key in doc.get("data", {}) if SECRET_NAMES.search(key)]
    for doc in workloads(docs):
        for c in containers(doc):
            for env in c.get("env", []):
                name, value = env["name"], env.get("value")
                # a URL without a password (dev's broker database for the ACL file) is no secret
                if SECRET_NAMES.search(name) and value is not None and (
                        "@" in value or not name.endswith("URL")):
                    wrong.append(f"{where(doc, c)}: {name} has a value")
    return wrong


def replicas(doc: Doc) -> int:
    return int(doc["spec"].get("replicas", 1))


# -- the tests --------------------------------------------------------------------------

def test_every_object_validates_against_the_two_newest_kubernetes_versions(
        rendered: Rendered) -> None:
    try:
        import kubernetes_validate  # type: ignore[import-untyped]
        from kubernetes_validate.utils import all_versions  # type: ignore[import-untyped]
    except ImportError:
        unavailable("kubernetes-validate is not installed (pip install -e '.[test]')")
    minors = sorted({tuple(int(p) for p in v.split(".")[:2]) for v in all_versions()})[-2:]
    versions = [f"{major}.{minor}.0" for major, minor in minors]
    assert len(versions) == 2
    for version in versions:
        for doc in rendered.docs:
            # strict: an unknown field (a typo) is an error too
            kubernetes_validate.validate(doc, version, strict=True)


def test_checkov_passes_and_every_skip_says_why(checkov_report: dict[str, Any],
                                                rendered: Rendered) -> None:
    results = checkov_report["results"]
    failed = [(c["check_id"], c["resource"], c["check_name"]) for c in results["failed_checks"]]
    assert failed == []
    assert checkov_report["summary"]["passed"] > 100  # it did check the manifests
    for skipped in results["skipped_checks"]:  # annotations: checkov.io/skipN: ID=reason
        assert len(skipped["check_result"].get("suppress_comment") or "") > 20, skipped["check_id"]
    # the configuration's skips: each ID is named in a comment above it, with the reason
    config = (K8S / "checkov" / f"{rendered.overlay}.yaml").read_text()
    skipped_ids = yaml.safe_load(config)["skip-check"]
    comments = "\n".join(line for line in config.splitlines() if line.lstrip().startswith("#"))
    for check_id in skipped_ids:
        assert re.search(rf"{check_id}\b.*\S", comments), check_id


def test_every_container_has_requests_and_limits_and_runs_unprivileged(
        rendered: Rendered) -> None:
    assert missing_resources(rendered.docs) == []
    assert root_or_writable(rendered.docs) == []


def test_secrets_are_referenced_never_held(rendered: Rendered) -> None:
    assert secret_values([d for d in rendered.docs if d["kind"] != "Secret"]) == []
    secrets = [d for d in rendered.docs if d["kind"] == "Secret"]
    if rendered.overlay == "production":
        assert secrets == []  # created by whoever deploys (README)
    else:  # dev: made by secretGenerator from the env files make-secrets.sh wrote
        assert {s["metadata"]["name"].rsplit("-", 1)[0] for s in secrets} == {
            "leafpool-worker", "leafpool-http", "leafpool-admin", "leafpool-flower",
            "leafpool-redis-acl", "leafpool-mariadb", "leafpool-zookeeper",
            "leafpool-mariadb-tls"}
    # each leafpool workload reads its own role's Secret (README, Security)
    roles = {"leafpool-segment-worker": "leafpool-worker", "leafpool-snowflake": "leafpool-worker",
             "leafpool-beat": "leafpool-worker", "leafpool-http": "leafpool-http",
             "leafpool-db-init": "leafpool-admin"}
    for doc in workloads(rendered.docs):
        role = roles.get(doc["metadata"]["name"])
        if role is None:
            continue
        refs = [e["secretRef"]["name"] for c in containers(doc)
                for e in c.get("envFrom", []) if "secretRef" in e]
        # and ZooKeeper's login: the snowflake workers alone (optional: no Secret, no login)
        zk = ["leafpool-zookeeper"] if doc["metadata"]["name"] == "leafpool-snowflake" else []
        assert [r.rsplit("-", 1)[0] if rendered.overlay == "dev" else r for r in refs] == [
            role, *zk]


def test_the_workloads(rendered: Rendered) -> None:
    docs = rendered.docs
    beat = find(docs, "Deployment", "leafpool-beat")
    assert replicas(beat) == 1
    (beat_c,) = containers(beat)
    assert beat_c["command"][:4] == ["celery", "-A", "workers", "beat"]

    snowflake = find(docs, "StatefulSet", "leafpool-snowflake")
    (worker,) = containers(snowflake)
    assert "leafpool.snowflake" in worker["command"]
    assert worker["command"][worker["command"].index("--concurrency") + 1] == "1"
    env = {e["name"]: e for e in worker["env"]}
    assert env["LEAFPOOL_SNOWFLAKE_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["LEAFPOOL_SNOWFLAKE_CLAIM_AT_START"]["value"] == "true"
    assert worker["readinessProbe"]["exec"]["command"] == ["leafpool", "probe", "snowflake"]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].startswith("leafpool-config")]
    assert config["data"]["LEAFPOOL_SNOWFLAKE_MODE"] == "k8s"
    assert config["data"]["LEAFPOOL_ZK_HOSTS"]
    assert "LEAFPOOL_SNOWFLAKE_WORKER_OFFSET" in config["data"]

    segment = find(docs, "Deployment", "leafpool-segment-worker")
    (seg,) = containers(segment)
    assert "leafpool.segment,leafpool.control" in seg["command"]
    assert "inspect ping -d segment@$HOSTNAME" in seg["livenessProbe"]["exec"]["command"][-1]

    http = find(docs, "Deployment", "leafpool-http")
    (web,) = containers(http)
    assert web["command"] == ["leafpool", "serve"]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = find(docs, "Service", "leafpool-http")
    assert service["spec"]["selector"] == http["spec"]["selector"]["matchLabels"]

    job = find(docs, "Job", "leafpool-db-init")
    (init,) = containers(job)
    assert init["command"] == ["leafpool", "db", "init"]

    for doc in workloads(docs):
        for c in containers(doc):
            if is_leafpool(c):
                assert c["image"] == "leafpool:latest", where(doc, c)  # kustomize images:


def test_every_leafpool_workload_can_verify_the_database_s_tls(rendered: Rendered) -> None:
    """The ConfigMap leafpool-database-ca (a CA's certificate is public; optional:
    production creates it when its database speaks TLS) is mounted read-only where
    LEAFPOOL_DATABASE_TLS_CA_FILE points, in every container of the leafpool image that
    loads leafpool-config."""
    for doc in workloads(rendered.docs):
        for c in containers(doc):
            config = [e["configMapRef"]["name"] for e in c.get("envFrom", [])
                      if "configMapRef" in e]
            if not is_leafpool(c) or not any(n.startswith("leafpool-config") for n in config):
                continue  # dev Redis's init container writes the ACL file: no database
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            assert mounts["db-tls"]["mountPath"] == "/etc/leafpool/db-tls", where(doc, c)
            assert mounts["db-tls"]["readOnly"] is True, where(doc, c)
            volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
            source = volumes["db-tls"]["configMap"]
            assert source["name"].startswith("leafpool-database-ca"), where(doc, c)
            assert source["optional"] is True


def test_dev_s_mariadb_and_zookeeper_refuse_clients_without_tls_or_a_login(
    renders: dict[str, Rendered],
) -> None:
    """dev: MariaDB with the dev CA's certificate and its user leaf REQUIRE SSL (an init
    script), leafpool set to TLS verified against that CA; ZooKeeper closing a session that
    does not log in. tests/database/test_tls.py and tests/snowflake/registry/test_zk_acl.py
    run both behaviours against real servers."""
    docs = renders["dev"].docs
    config = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].startswith("leafpool-config"))
    assert config["data"]["LEAFPOOL_DATABASE_TLS"] == "true"
    assert config["data"]["LEAFPOOL_DATABASE_TLS_CA_FILE"] == "/etc/leafpool/db-tls/ca.crt"
    statefulset = find(docs, "StatefulSet", "mariadb")
    (mariadb,) = [c for c in containers(statefulset) if c["name"] == "mariadb"]
    assert mariadb["args"] == ["--ssl-ca=/etc/mysql/tls/ca.crt",
                               "--ssl-cert=/etc/mysql/tls/tls.crt",
                               "--ssl-key=/etc/mysql/tls-key/tls.key"]
    # the server's key: from its Secret through an init container into a memory emptyDir
    (key,) = statefulset["spec"]["template"]["spec"]["initContainers"]
    assert key["env"][0]["valueFrom"]["secretKeyRef"]["name"].startswith("leafpool-mariadb-tls")
    assert "umask 077" in key["command"][-1]
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls-key"]["emptyDir"]["medium"] == "Memory"
    init = next(d for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].startswith("leafpool-mariadb-init"))
    assert "ALTER USER 'leaf'@'%' REQUIRE SSL;" in init["data"]["require-ssl.sql"]
    mounts = {m["mountPath"]: m["name"] for m in mariadb["volumeMounts"]}
    assert {"/etc/mysql/tls", "/etc/mysql/tls-key", "/docker-entrypoint-initdb.d"} <= set(mounts)
    (zookeeper,) = containers(find(docs, "StatefulSet", "zookeeper"))
    env = {e["name"]: e.get("value") for e in zookeeper["env"]}
    assert env["ZOO_CFG_EXTRA"] == "enforce.auth.enabled=true enforce.auth.schemes=digest"


def test_dev_runs_one_of_each_with_its_own_servers(renders: dict[str, Rendered]) -> None:
    docs = renders["dev"].docs
    for name in ("redis", "mariadb", "zookeeper"):
        assert replicas(find(docs, "StatefulSet", name)) == 1
    for doc in workloads(docs):
        assert doc["kind"] == "Job" or replicas(doc) == 1, doc["metadata"]["name"]
    find(docs, "Deployment", "leafpool-flower")  # the optional component, included


def test_production_is_replicated_and_fenced(renders: dict[str, Rendered]) -> None:
    docs = renders["production"].docs
    assert replicas(find(docs, "Deployment", "leafpool-segment-worker")) >= 2
    assert replicas(find(docs, "StatefulSet", "leafpool-snowflake")) >= 2
    assert "replicas" not in find(docs, "Deployment", "leafpool-http")["spec"]  # the HPA's
    hpa = find(docs, "HorizontalPodAutoscaler", "leafpool-http")
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["scaleTargetRef"]["name"] == "leafpool-http"
    covered = {d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component")
               for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert covered >= {"http", "segment-worker", "snowflake-worker"}
    deny = find(docs, "NetworkPolicy", "leafpool-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    for doc in docs:  # no in-cluster data servers: they are yours
        assert doc["metadata"]["name"] not in {"redis", "mariadb", "zookeeper"}
    assert find(docs, "Namespace", "leafpool")["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_checks_catch_an_unsafe_variant(rendered: Rendered) -> None:
    """Each check above fails on a manifest made unsafe the way it guards against."""
    docs = copy.deepcopy(rendered.docs)
    http = find(docs, "Deployment", "leafpool-http")
    web = pod_spec(http)["containers"][0]
    del web["resources"]["limits"]
    web["securityContext"]["readOnlyRootFilesystem"] = False
    pod_spec(http)["securityContext"]["runAsNonRoot"] = False
    del pod_spec(http)["securityContext"]["seccompProfile"]
    web.setdefault("env", []).append(
        {"name": "LEAFPOOL_REDIS_URL", "value": "redis://leafpool-http:secret@redis:6379/0"})
    docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                 "stringData": {"LEAFPOOL_DATABASE_URL": "mysql+pymysql://u:p@db/leaf"}})
    where_ = "Deployment/leafpool-http container http"
    assert f"{where_}: no limits.cpu" in missing_resources(docs)
    assert {f"{where_}: may run as root", f"{where_}: writable root filesystem",
            f"{where_}: no RuntimeDefault seccomp profile"} <= set(root_or_writable(docs))
    new = set(secret_values(docs)) - set(secret_values(rendered.docs))  # dev's own Secrets
    assert new == {f"{where_}: LEAFPOOL_REDIS_URL has a value", "Secret/s holds values"}


def test_dev_does_not_render_without_its_secret_files(kubectl: str, tmp_path: Path) -> None:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("*.env"))
    done = _render(kubectl, root / "overlays" / "dev")
    assert done.returncode != 0
    # the first file the overlay reads and make-secrets.sh writes is named
    assert "secrets/db-tls" in done.stderr or "secrets/worker.env" in done.stderr


# -- the probes as the manifests write them, run against real processes -------------------

def _pod_env(docs: list[Doc], **overrides: str) -> dict[str, str]:
    """The environment a leafpool pod gets from the ConfigMap, with ``overrides`` in place
    of its Secret and of what cannot be the same here (the port, the home)."""
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].startswith("leafpool-config")]
    return leafpool_env({**config["data"], **overrides})


def _exec(command: list[str], env: dict[str, str]) -> int:
    argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    if argv[0] == "leafpool":
        argv = [sys.executable, "-m", "leafpool.cli", *argv[1:]]
    return subprocess.run(argv, env=env, capture_output=True, timeout=60).returncode


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_http_probes_answer_on_a_real_service(renders: dict[str, Rendered], redis_url: str,
                                                  tmp_path: Path) -> None:
    docs = renders["production"].docs
    (web,) = containers(find(docs, "Deployment", "leafpool-http"))
    port = free_port()
    env = _pod_env(docs, LEAFPOOL_REDIS_URL=redis_url, LEAFPOOL_HTTP_PORT=str(port),
                   LEAFPOOL_HTTP_HOST="127.0.0.1", LEAFPOOL_HOME=str(tmp_path),
                   LEAFPOOL_DATABASE_URL=f"sqlite:///{tmp_path / 'leafpool.sqlite3'}")
    assert web["command"] == ["leafpool", "serve"]
    serve = Proc([sys.executable, "-m", "leafpool.cli", "serve"], env)
    try:
        base = f"http://127.0.0.1:{port}"
        live = web["livenessProbe"]["httpGet"]["path"]
        ready = web["readinessProbe"]["httpGet"]["path"]
        wait_until(lambda: port_open(port), 30, "leafpool serve")
        assert _get(base + live) == 200
        wait_until(lambda: _get(base + ready) == 200, 10, "ready")
    finally:
        serve.stop()


def test_the_beat_and_snowflake_readiness_commands_run(renders: dict[str, Rendered],
                                                       redis_url: str, tmp_path: Path) -> None:
    docs = renders["production"].docs
    env = _pod_env(docs, LEAFPOOL_REDIS_URL=redis_url, LEAFPOOL_HOME=str(tmp_path))
    (beat,) = containers(find(docs, "Deployment", "leafpool-beat"))
    probe = beat["readinessProbe"]["exec"]["command"]
    client = redis.Redis.from_url(redis_url)
    try:
        assert _exec(probe, env) == 1  # no beat holds the lock
        client.set("leafpool:beat:lock", "a beat", px=60_000)
        assert _exec(probe, env) == 0
    finally:
        client.close()
    (worker,) = containers(find(docs, "StatefulSet", "leafpool-snowflake"))
    # no generator runs here: the command exists and says not ready (1), not a usage error (2)
    assert _exec(worker["readinessProbe"]["exec"]["command"], env) == 1
