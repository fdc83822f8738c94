"""The Kubernetes dev overlay's workloads run (issue 27, item 4): ops/k8s/overlays/dev
rendered with ``kubectl kustomize`` (as tests/system/test_k8s.py does; without kubectl this
skips saying so), then every workload started by podman from the image the suite builds and
the stand-in service images (tests/support/containers.py), with the manifests' own
commands, environment (the ConfigMap, and the Secrets made from make-secrets.sh's env
files, as podman secrets), users, read-only root filesystems and volumes (emptyDir,
persistentVolumeClaim, subPath), each Service's name resolving to the pod it selects.

- Deployments are given to ``podman kube play`` as they are. StatefulSets and the Job,
  kinds podman does not play, become their pod templates as their controllers would make
  them: ``<name>-<index>`` with the ``apps.kubernetes.io/pod-index`` label (which the
  snowflake workers read through the downward API) and a claim per volumeClaimTemplate
  (``<template>-<pod>``); the Job's pod keeps its restartPolicy (OnFailure).
- The snowflake StatefulSet runs two pods (as ``replicas: 2`` would): each takes the
  worker ID of its pod index (offset 0).
- Every container's readiness and liveness probe is run as the kubelet runs it until it
  passes: exec probes in the container (``podman exec``: its user, its environment),
  httpGet probes against the pod's address and the named port, from inside the pod's
  network namespace. The db-init Job's pod completes (exit 0).
- Each container runs as the manifest's user, and a read-only root filesystem refuses a
  write; the ConfigMap's and its Secrets' keys are in its environment.

What of the official images' contracts this relies on, and so covers in the stand-ins
(ops/images/*/Containerfile): MariaDB's MARIADB_DATABASE, MARIADB_USER, MARIADB_PASSWORD
and MARIADB_ROOT_PASSWORD, its ``healthcheck.sh --connect --innodb_initialized``, its uid
999 writing only /var/lib/mysql, /run/mysqld and /tmp (a read-only root); Redis's
redis-server and redis-cli on PATH run as another user (the manifest's command replaces the
entrypoint); ZooKeeper's entrypoint run as uid 1000 writing /conf/zoo.cfg from
ZOO_4LW_COMMANDS_WHITELIST, /data and /datalog, ``zkServer.sh status``.

What differs from a cluster, and why: the data servers (Redis, MariaDB, ZooKeeper) start
first and the leafpool workloads once their readiness probes pass (podman restarts a
failing container at once, with no back-off: a crash-looping Job would take the two cores
meanwhile); a pod with init containers is played with restartPolicy OnFailure instead of
Always (podman 4.3 gives the pod's policy to its init containers too, and restarts a
finished init container forever); each emptyDir is renamed after its pod (podman 4.3 makes
one named volume of an emptyDir's name, shared by every pod naming it); a claim's volume
is made empty and given the pod's fsGroup as the kubelet does (podman applies no fsGroup,
and would copy the image's directory and its owner into a new volume); exec probes get the
container's HOSTNAME (podman 4.3 leaves it out of an exec'd process). Resources and
sizeLimit are not applied.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import containers as c
from tests.support.services import wait_until
from tests.system.test_k8s import K8S, _render, pod_spec

# the first test to use the images builds them: 6 min on a machine without the cache
# one xdist worker runs every container test (./dev test -n): one image build, one podman
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("containers")]
pytest_plugins = ["tests.support.container_fixtures"]

Doc = dict[str, Any]
DATA_SERVERS = ("redis", "mariadb", "zookeeper")
SNOWFLAKE_PODS = 2


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        # as tests/system/test_k8s.py: no Debian package provides kubectl in bookworm
        pytest.skip("kubectl is not installed (not a Debian package in bookworm; the "
                    "manifests are rendered with `kubectl kustomize`)")
    root = tmp_path_factory.mktemp("k8s-pods") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("*.env"))
    made = subprocess.run(["sh", str(root / "overlays" / "dev" / "make-secrets.sh")],
                          capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    done = _render(kubectl, root / "overlays" / "dev")
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


@dataclass
class Played:
    """A pod started from a workload, and what the test checks in it."""

    workload: Doc
    pod: str
    spec: Doc  # the pod spec as played
    labels: dict[str, str]


@dataclass
class Cluster:
    podman: c.Podman
    docs: list[Doc]
    workdir: Path
    network: str
    played: list[Played] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def aliases(self, labels: dict[str, str]) -> list[str]:
        """The Services whose selector picks a pod with ``labels``."""
        return [s["metadata"]["name"] for s in of_kind(self.docs, "Service")
                if s["spec"].get("selector") and
                all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]

    def play(self, workload: Doc, pod_docs: list[Doc], name: str, spec: Doc,
             labels: dict[str, str]) -> None:
        net = self.network
        aliases = self.aliases(labels)
        if aliases:
            net += ":" + ",".join(f"alias={a}" for a in aliases)
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all([*of_kind(self.docs, "ConfigMap"), *pod_docs]))
        self.files.append(path)
        self.podman("kube", "play", "--network", net, str(path), timeout=300)
        self.played.append(Played(workload, name, spec, labels))

    def play_deployment(self, doc: Doc) -> None:
        doc = copy.deepcopy(doc)
        name = doc["metadata"]["name"]
        private_empty_dirs(pod_spec(doc), name)
        labels = dict(doc["spec"]["template"]["metadata"]["labels"])
        self.play(doc, [doc], f"{name}-pod-0", pod_spec(doc), labels)

    def claim(self, name: str, fs_group: int | None) -> None:
        """A PersistentVolumeClaim's volume as a cluster hands it over: empty, and with the
        pod's fsGroup applied as the kubelet does (the group owns it, may write it, and
        passes itself on: setgid). Podman 4.3's kube play applies no fsGroup, and would
        give a new volume the owner of the image's directory mounted there (copy-up): a
        first mount by a throwaway container (root, nothing under its mount point) takes
        that step first."""
        self.podman("volume", "create", name)
        self.podman("run", "--rm", "--network", "none", "--user", "0", "--volume",
                    f"{name}:/claim", c.LEAFPOOL_IMAGE, "true")
        if fs_group is not None:
            mountpoint = Path(self.podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                          name).stdout.strip())
            os.chown(mountpoint, 0, fs_group)
            mountpoint.chmod(0o2775)

    def play_pod(self, doc: Doc, name: str, extra_labels: dict[str, str]) -> None:
        """The workload's pod template as its controller would make pod ``name``."""
        template = copy.deepcopy(doc["spec"]["template"])
        spec: Doc = template["spec"]
        private_empty_dirs(spec, name)
        labels = {**template["metadata"].get("labels", {}), **extra_labels}
        for claim in doc["spec"].get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{name}"
            self.claim(claim_name, spec.get("securityContext", {}).get("fsGroup"))
            spec.setdefault("volumes", []).append(
                {"name": claim["metadata"]["name"],
                 "persistentVolumeClaim": {"claimName": claim_name}})
        if spec.get("initContainers") and spec.get("restartPolicy", "Always") == "Always":
            spec["restartPolicy"] = "OnFailure"  # podman 4.3: see the module's docstring
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": labels,
                            "annotations": template["metadata"].get("annotations", {})},
               "spec": spec}
        self.play(doc, [pod], name, spec, labels)

    def container(self, played: Played, name: str) -> str:
        return f"{played.pod}-{name}"


def private_empty_dirs(spec: Doc, pod: str) -> None:
    """Each emptyDir of ``spec`` renamed after its pod: podman 4.3 makes an emptyDir a
    named volume of the emptyDir's own name, which every pod naming it shares."""
    renamed = {}
    for volume in spec.get("volumes", []):
        if "emptyDir" in volume:
            renamed[volume["name"]] = volume["name"] = f"{pod}-{volume['name']}"
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])


def probe_passes(cluster: Cluster, played: Played, container: Doc, probe: Doc) -> bool:
    p = cluster.podman
    name = cluster.container(played, container["name"])
    timeout = float(probe.get("timeoutSeconds", 1)) + 10  # + podman's own start-up
    if "exec" in probe:
        try:
            done = p.exec(name, *probe["exec"]["command"], timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0
    get = probe["httpGet"]
    port = get["port"]
    if isinstance(port, str):  # a named port of the container
        (port,) = [q["containerPort"] for q in container.get("ports", []) if q["name"] == port]
    (info,) = p.inspect(name)
    address = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
    code = ("import sys, urllib.request\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://{address}:{port}{get['path']}', timeout=5)\n"
            "    sys.exit(0 if 200 <= r.status < 400 else 1)\n"
            "except Exception:\n"
            "    sys.exit(1)\n")
    # the kubelet asks the pod's address; from inside the pod's network namespace here
    asked = subprocess.run(["nsenter", f"--target={info['State']['Pid']}", "--net",
                            sys.executable, "-c", code], capture_output=True, timeout=timeout)
    return asked.returncode == 0


def wait_probes(cluster: Cluster, played: list[Played], timeout: float) -> None:
    """Every readiness and liveness probe of these pods passes, each within ``timeout``."""
    deadline = time.monotonic() + timeout
    for pod in played:
        for container in pod.spec["containers"]:
            for kind in ("readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                if probe is None:
                    continue
                left = deadline - time.monotonic()
                wait_until(lambda: probe_passes(cluster, pod, container, probe),  # noqa: B023
                           max(left, 1), f"{pod.pod} {container['name']} {kind}",
                           interval=1)


@pytest.fixture(scope="module")
def cluster(rendered: list[Doc], podman: c.Podman, images: c.BuildReport,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # (rendered first: without kubectl the module skips before anything is built)
    workdir = tmp_path_factory.mktemp("k8s-played")
    network = "leafpool-dev"
    podman("network", "create", network)
    cluster = Cluster(podman, rendered, workdir, network)
    try:
        for secret in of_kind(rendered, "Secret"):  # podman's form: {key: base64 value}
            path = workdir / f"{secret['metadata']['name']}.json"
            path.write_text(json.dumps(secret.get("data", {})))
            podman("secret", "create", secret["metadata"]["name"], str(path))
            path.unlink()
        started = time.monotonic()
        for name in DATA_SERVERS:
            cluster.play_pod(named(rendered, "StatefulSet", name), f"{name}-0",
                             {"apps.kubernetes.io/pod-index": "0"})
        wait_probes(cluster, cluster.played, 180)
        servers_in = time.monotonic() - started
        first = len(cluster.played)
        (job,) = of_kind(rendered, "Job")
        cluster.play_pod(job, f"{job['metadata']['name']}-0",
                         {"job-name": job["metadata"]["name"]})
        snowflake = named(rendered, "StatefulSet", "leafpool-snowflake")
        for index in range(SNOWFLAKE_PODS):
            cluster.play_pod(snowflake, f"leafpool-snowflake-{index}",
                             {"apps.kubernetes.io/pod-index": str(index)})
        for deployment in of_kind(rendered, "Deployment"):
            cluster.play_deployment(deployment)
        wait_probes(cluster, cluster.played[first:], 240)
        print(f"dev overlay: data servers ready in {servers_in:.1f} s, every probe passing "
              f"in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        if cluster.played:  # killed first: `pod rm` stops each pod's containers in turn
            pods = [p.pod for p in cluster.played]
            podman("pod", "kill", *pods, check=False)
            podman("pod", "rm", "--force", "--time", "0", *pods, check=False)
        podman("volume", "prune", "--force", check=False)
        podman("network", "rm", "--force", network, check=False)
        for secret in of_kind(rendered, "Secret"):
            podman("secret", "rm", secret["metadata"]["name"], check=False)


def env_of(cluster: Cluster, container: str) -> dict[str, str]:
    out = cluster.podman("exec", container, "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_every_probe_passes_and_the_job_completes(cluster: Cluster) -> None:
    # (the fixture waited for the probes) the Job's pod ran `leafpool db init` to exit 0
    (job,) = [p for p in cluster.played if p.workload["kind"] == "Job"]
    name = cluster.container(job, job.spec["containers"][0]["name"])
    wait_until(lambda: not cluster.podman.inspect(name)[0]["State"]["Running"], 120,
               "the db-init Job's pod to finish")
    assert cluster.podman.inspect(name)[0]["State"]["ExitCode"] == 0


def test_each_container_runs_as_its_user_read_only_with_its_config_and_secrets(
        cluster: Cluster) -> None:
    configs = {d["metadata"]["name"]: d.get("data", {}) for d in of_kind(cluster.docs,
                                                                           "ConfigMap")}
    secrets = {d["metadata"]["name"]: {k: base64.b64decode(v).decode()
                                       for k, v in d.get("data", {}).items()}
               for d in of_kind(cluster.docs, "Secret")}
    checked = 0
    for played in cluster.played:
        if played.workload["kind"] == "Job":
            continue  # finished: nothing to exec in
        pod_ctx = played.spec.get("securityContext", {})
        for container in played.spec["containers"]:
            name = cluster.container(played, container["name"])
            ctx = {**pod_ctx, **container.get("securityContext", {})}
            uid = cluster.podman("exec", name, "id", "-u").stdout.strip()
            assert uid == str(ctx["runAsUser"]), name
            wrote = cluster.podman("exec", name, "touch", "/.leafpool-write-check", check=False)
            if ctx.get("readOnlyRootFilesystem"):
                assert wrote.returncode != 0 and "Read-only" in wrote.stderr, name
            env = env_of(cluster, name)
            for ref in container.get("envFrom", []):
                source = (configs[ref["configMapRef"]["name"]] if "configMapRef" in ref
                          else secrets[ref["secretRef"]["name"]])
                assert {k: env.get(k) for k in source} == source, name
            checked += 1
    assert checked >= 9  # 3 data servers, 2 snowflake pods, 4 Deployments


def test_the_snowflake_pods_take_their_worker_ids_from_the_pod_index(
        cluster: Cluster) -> None:
    for index in range(SNOWFLAKE_PODS):
        name = f"leafpool-snowflake-{index}-worker"
        done = cluster.podman("exec", name, "leafpool", "probe", "snowflake")
        assert f": worker {index} (k8s" in done.stdout, done.stdout
        assert env_of(cluster, name)["LEAFPOOL_SNOWFLAKE_POD_INDEX"] == str(index)
