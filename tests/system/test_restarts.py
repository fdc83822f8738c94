"""A Celery worker or beat that exits anyway is started again (docs/design.md §3.9): in the
shipped docker-compose.yml every service running ``celery -A workers worker`` or ``beat``
has a restart policy that restarts it, and in the Kubernetes manifests each runs in a
Deployment or StatefulSet, whose pods restart their containers (``restartPolicy: Always``,
the only one those kinds accept). The worker no longer exits on a broker failover
(``workers/broker.py``, tests/system/test_sentinel_failover.py); these are the supervisor
behind it, for whatever else stops one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.system.test_compose import HA_SECRETS, SECRETS, compose_config
from tests.system.test_k8s import (  # noqa: F401  (kubectl, renders, tree: fixtures)
    Rendered,
    containers,
    kubectl,
    pod_spec,
    renders,
    tree,
    workloads,
)

CELERY_ROLES = ("worker", "beat")


def _celery_role(command: list[str] | str | None) -> str | None:
    """``worker`` or ``beat`` for a ``celery -A workers worker|beat ...`` command."""
    argv = command.split() if isinstance(command, str) else list(command or [])
    if "celery" not in argv:
        return None
    return next((a for a in argv if a in CELERY_ROLES), None)


def test_compose_restarts_every_celery_worker_and_beat(tmp_path: Path) -> None:
    config: dict[str, Any] = compose_config(tmp_path, {**SECRETS, **HA_SECRETS})
    celery = {name: svc for name, svc in config["services"].items()
              if _celery_role(svc.get("command")) is not None}
    roles = {_celery_role(svc.get("command")) for svc in celery.values()}
    assert roles == set(CELERY_ROLES), celery.keys()
    assert {"segment-worker", "snowflake-worker", "beat", "segment-worker-ha"} <= set(celery)
    for name, svc in celery.items():
        assert svc.get("restart") in ("unless-stopped", "always"), (name, svc.get("restart"))


def test_kubernetes_restarts_every_celery_worker_and_beat(
    renders: dict[str, Rendered],  # noqa: F811  (the fixture imported above)
) -> None:
    for overlay, rendered in renders.items():
        found = set()
        for doc in workloads(rendered.docs):
            for c in containers(doc):
                role = _celery_role(c.get("command"))
                if role is None:
                    continue
                found.add(role)
                where = f"{overlay}: {doc['kind']} {doc['metadata']['name']}"
                assert doc["kind"] in ("Deployment", "StatefulSet"), where
                assert pod_spec(doc).get("restartPolicy", "Always") == "Always", where
        assert found == set(CELERY_ROLES), overlay
