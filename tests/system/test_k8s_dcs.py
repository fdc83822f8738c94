"""Two data centers on Kubernetes (issue 31; docs/how-to/multiple-dcs.md, docs/design.md
§12): the overlays ops/k8s/overlays/dc-a and dc-b, rendered with ``kubectl kustomize``.

- Every leafpool container (the workers, the beat, the HTTP service, the db-init Job) reads
  LEAFPOOL_DC_ID, LEAFPOOL_DC_COUNT and LEAFPOOL_DC_SEGMENTS from the ConfigMap
  leafpool-config with its DC's values, no ``env`` entry overrides them, and the settings
  each container gets are accepted by leafpool's own validation.
- The worker IDs of each DC's snowflake StatefulSet, computed by leafpool's own k8s-mode
  code for every pod index up to its replicas, lie in the DC's range and the two DCs'
  are disjoint.
- Each DC's overlay is the production overlay plus the DC settings: once the generated
  ConfigMap's hashed name and those settings are set aside the three renderings are
  equal (so tests/system/test_k8s.py's checks of production, checkov's included, hold for
  both DCs), and dc-a and dc-b differ in LEAFPOOL_DC_ID alone.

Without kubectl these skip saying so, as tests/system/test_k8s.py does.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from typing import Any

import pytest
import yaml

from leafpool.core.config import load_settings
from leafpool.snowflake.registry.k8s import pod_worker_id
from tests.system.test_k8s import K8S, _render, containers, find, is_leafpool, where, workloads

Doc = dict[str, Any]
CONFIG = "leafpool-config"
#: the overlays, and the DC settings each gives every leafpool container
DCS = {"dc-a": {"LEAFPOOL_DC_ID": "0", "LEAFPOOL_DC_COUNT": "2", "LEAFPOOL_DC_SEGMENTS": "shared"},
       "dc-b": {"LEAFPOOL_DC_ID": "1", "LEAFPOOL_DC_COUNT": "2", "LEAFPOOL_DC_SEGMENTS": "shared"}}
#: what may differ between the DCs' renderings and production's: the DC settings alone
DC_KEYS = {"LEAFPOOL_DC_ID", "LEAFPOOL_DC_COUNT", "LEAFPOOL_DC_SEGMENTS"}
WORKER_IDS = 1024
HASHED = re.compile(rf"\b({CONFIG})-[a-z0-9]{{10}}\b")


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Doc]]:
    """production, dc-a and dc-b rendered once each (no Secret files needed: production's
    Secrets are made by whoever deploys)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        # as tests/system/test_k8s.py: no Debian package provides kubectl in bookworm
        pytest.skip("kubectl is not installed (not a Debian package in bookworm; the "
                    "manifests are rendered with `kubectl kustomize`)")
    out = {}
    for overlay in ("production", *DCS):
        done = _render(kubectl, K8S / "overlays" / overlay)
        assert done.returncode == 0, done.stderr
        out[overlay] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return out


# -- what the checks read ----------------------------------------------------------------

def configmaps(docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: dict(d.get("data", {}))
            for d in docs if d["kind"] == "ConfigMap"}


def container_env(docs: list[Doc], container: Doc) -> dict[str, str | None]:
    """The variables a container gets from its ConfigMaps (envFrom, in order) and its
    ``env`` entries, which win; a ``valueFrom`` entry's value is None (known at run time).
    Secrets are not in the rendering (production's are made by whoever deploys)."""
    maps = configmaps(docs)
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps.get(source["configMapRef"]["name"], {}))
    for entry in container.get("env", []):
        env[entry["name"]] = entry.get("value")
    return env


def loads_config(container: Doc) -> bool:
    return any(HASHED.sub(r"\1", s["configMapRef"]["name"]) == CONFIG
               for s in container.get("envFrom", []) if "configMapRef" in s)


def dc_settings_wrong(docs: list[Doc], want: dict[str, str]) -> list[str]:
    """Each leafpool container that does not get the DC settings ``want``, and why."""
    wrong = []
    for doc in workloads(docs):
        for c in containers(doc):
            if not is_leafpool(c):
                continue
            if not loads_config(c):
                wrong.append(f"{where(doc, c)}: does not load {CONFIG}")
            env = container_env(docs, c)
            for name, value in want.items():
                if env.get(name) != value:
                    wrong.append(f"{where(doc, c)}: {name}={env.get(name)!r}, not {value!r}")
    return wrong


def settings_of(env: dict[str, str | None], **more: str) -> Any:
    """leafpool's settings from a container's variables, validated as a process would."""
    values = {k.removeprefix("LEAFPOOL_").lower(): v for k, v in {**env, **more}.items()
              if k.startswith("LEAFPOOL_") and v is not None}
    return load_settings(**values)


def snowflake_worker_ids(docs: list[Doc]) -> list[int]:
    """The worker ID of each pod of the snowflake StatefulSet (pod index 0 to replicas -
    1), as leafpool's k8s mode computes it from the pod's settings."""
    statefulset = find(docs, "StatefulSet", "leafpool-snowflake")
    (worker,) = containers(statefulset)
    env = container_env(docs, worker)
    ids = []
    for index in range(int(statefulset["spec"].get("replicas", 1))):
        settings = settings_of(env, LEAFPOOL_SNOWFLAKE_POD_INDEX=str(index))
        ids.append(pod_worker_id(settings, f"leafpool-snowflake-{index}"))
    return ids


def dc_range(env: dict[str, str | None]) -> range:
    """The worker IDs of the container's DC (docs/design.md §12.1)."""
    dc_id, count = int(env["LEAFPOOL_DC_ID"] or 0), int(env["LEAFPOOL_DC_COUNT"] or 1)
    size = WORKER_IDS // count
    return range(dc_id * size, (dc_id + 1) * size)


def worker_ids_wrong(renders: dict[str, list[Doc]]) -> list[str]:
    """Snowflake worker IDs outside their DC's range, or taken by two DCs."""
    wrong: list[str] = []
    seen: dict[int, str] = {}
    for overlay, docs in renders.items():
        (worker,) = containers(find(docs, "StatefulSet", "leafpool-snowflake"))
        allowed = dc_range(container_env(docs, worker))
        for worker_id in snowflake_worker_ids(docs):
            if worker_id not in allowed:
                wrong.append(f"{overlay}: worker ID {worker_id} outside its DC's range "
                             f"{allowed.start}..{allowed.stop - 1}")
            if worker_id in seen:
                wrong.append(f"{overlay}: worker ID {worker_id} also in {seen[worker_id]}")
            seen[worker_id] = overlay
    return wrong


def without_dc_settings(docs: list[Doc]) -> list[Doc]:
    """The rendering with the ConfigMap's hash and the DC settings set aside."""
    docs = json.loads(HASHED.sub(r"\1", json.dumps(docs)))
    for doc in docs:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == CONFIG:
            for key in DC_KEYS:
                doc["data"].pop(key, None)
    return list(docs)


def config_data(docs: list[Doc]) -> dict[str, str]:
    (data,) = [d for name, d in configmaps(docs).items() if HASHED.sub(r"\1", name) == CONFIG]
    return data


# -- the tests --------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", DCS)
def test_every_leafpool_container_gets_its_dc_s_settings(renders: dict[str, list[Doc]],
                                                         overlay: str) -> None:
    docs = renders[overlay]
    assert dc_settings_wrong(docs, DCS[overlay]) == []
    checked = set()
    for doc in workloads(docs):
        for c in containers(doc):
            if is_leafpool(c):
                settings = settings_of(container_env(docs, c))  # accepted, as a process does
                assert (settings.dc_id, settings.dc_count, settings.dc_segments) == (
                    int(DCS[overlay]["LEAFPOOL_DC_ID"]), 2, "shared"), where(doc, c)
                checked.add(doc["metadata"]["name"])
    assert checked == {"leafpool-segment-worker", "leafpool-snowflake", "leafpool-beat",
                       "leafpool-http", "leafpool-db-init"}


def test_the_dcs_snowflake_workers_take_disjoint_worker_ids_in_their_ranges(
        renders: dict[str, list[Doc]]) -> None:
    dcs = {overlay: renders[overlay] for overlay in DCS}
    assert worker_ids_wrong(dcs) == []
    assert all(len(snowflake_worker_ids(docs)) >= 2 for docs in dcs.values())  # replicas


def test_each_dc_is_production_and_its_dc_settings(renders: dict[str, list[Doc]]) -> None:
    production = without_dc_settings(renders["production"])
    for overlay in DCS:
        assert without_dc_settings(renders[overlay]) == production, overlay
    a, b = (config_data(renders[overlay]) for overlay in DCS)
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"LEAFPOOL_DC_ID"}
    assert DC_KEYS.isdisjoint(config_data(renders["production"]))  # one DC: the defaults


def test_the_checks_catch_an_unsafe_variant(renders: dict[str, list[Doc]]) -> None:
    """dc-b given dc-a's DC ID, one container overriding it, one not loading the
    ConfigMap: each is reported, and the DCs' worker IDs then collide."""
    docs = copy.deepcopy(renders["dc-b"])
    for doc in docs:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith(CONFIG):
            doc["data"]["LEAFPOOL_DC_ID"] = "0"
    wrong = dc_settings_wrong(docs, DCS["dc-b"])
    assert "Deployment/leafpool-http container http: LEAFPOOL_DC_ID='0', not '1'" in wrong
    collide = worker_ids_wrong({"dc-a": renders["dc-a"], "dc-b": docs})
    assert "dc-b: worker ID 0 also in dc-a" in collide

    docs = copy.deepcopy(renders["dc-b"])
    (web,) = containers(find(docs, "Deployment", "leafpool-http"))
    web.setdefault("env", []).append({"name": "LEAFPOOL_DC_ID", "value": "0"})
    (beat,) = containers(find(docs, "Deployment", "leafpool-beat"))
    beat["envFrom"] = [s for s in beat["envFrom"] if "configMapRef" not in s]
    assert set(dc_settings_wrong(docs, DCS["dc-b"])) == {
        "Deployment/leafpool-http container http: LEAFPOOL_DC_ID='0', not '1'",
        f"Deployment/leafpool-beat container beat: does not load {CONFIG}",
        *(f"Deployment/leafpool-beat container beat: {k}=None, not {v!r}"
          for k, v in DCS["dc-b"].items())}


def test_the_overlays_name_their_dc_in_their_own_words() -> None:
    """The DC overlays' files differ only in their first line and LEAFPOOL_DC_ID (a change
    to one made in the other too)."""
    a, b = ((K8S / "overlays" / overlay / "kustomization.yaml").read_text().splitlines()
            for overlay in DCS)
    differ = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert [y for _, y in differ[1:]] == ["      - LEAFPOOL_DC_ID=1"], differ
