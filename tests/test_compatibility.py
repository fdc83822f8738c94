"""The compatibility policy's frozen surfaces (docs/reference/compatibility.md), compared
between the previous release (tests/support/releases.py: its tree from the repository's
history) and the current code, each read by a process of its own release:

- the Celery layout: the broker key prefix, the queues, which queue each task goes to, and
  the tasks with the arguments they are sent: a beat or sweep of either release queues
  where the other release's workers read, and their workers run what the other's
  beat and sweep send (issue 29: builds before 0.1.0 queued under no broker prefix, and
  a rollout's old workers stopped refilling once the new beat ran, or the old beat queued
  where no new worker read);
- the Redis key names: kept, new ones may come (applications in other languages pop
  ``P:{TAG}:ids``);
- the settings: every setting of the previous release is one of the current release.

The mixed-version test (tests/system/test_mixed_versions.py) runs the releases side by
side; this one says which surface moved when that one fails, and fails in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ROOT, leafpool_env
from tests.support.releases import previous_release

DUMP = r"""
import inspect, json
from leafpool.core.config import Settings
from leafpool.core.keys import Keys
from workers.application import app
import workers.tasks

conf = app.conf
tasks = {}
for name, task in sorted(app.tasks.items()):
    if name.startswith("leafpool."):
        params = list(inspect.signature(task.run).parameters.values())
        tasks[name] = {
            "required": [p.name for p in params if p.default is p.empty
                         and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            "accepted": [p.name for p in params
                         if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
        }
keys = Keys()
print(json.dumps({
    "prefix": conf.broker_transport_options.get("global_keyprefix", ""),
    "queues": sorted(q.name for q in conf.task_queues),
    "default_queue": conf.task_default_queue,
    "routes": {name: route["queue"] for name, route in conf.task_routes.items()},
    "scheduled": sorted(entry["task"] for entry in conf.beat_schedule.values()),
    "tasks": tasks,
    "keys": [*keys.tag("t").all(), keys.tags, keys.wanted, keys.beat_lock],
    "settings": sorted(Settings.model_fields),
}))
"""


def _layout(pythonpath: Path) -> dict[str, Any]:
    env = {**leafpool_env(), "PYTHONPATH": str(pythonpath), "PYTHONSAFEPATH": "1"}
    done = subprocess.run([sys.executable, "-c", DUMP], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    layout: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return layout


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    release = previous_release(tmp_path_factory.mktemp("previous"))
    return _layout(release.tree), _layout(ROOT)


def _queue(layout: dict[str, Any], task: str) -> str:
    return str(layout["routes"].get(task, layout["default_queue"]))


def test_either_releases_tasks_go_where_the_others_workers_read(
    layouts: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A worker started as the shipped files start it (no ``-Q``) reads every queue of its
    release's ``task_queues``, under its broker prefix."""
    previous, current = layouts
    assert previous["prefix"] == current["prefix"], (
        "the broker key prefix moved: one release's workers read none of the other's queues")
    for sender, reader, who in ((previous, current, "previous -> current"),
                                (current, previous, "current -> previous")):
        for task in sender["tasks"]:
            assert _queue(sender, task) in reader["queues"], (
                f"{who}: {task} goes to {_queue(sender, task)!r}, which the other release's "
                f"workers do not read ({reader['queues']})")


def test_either_releases_workers_run_what_the_other_sends(
    layouts: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Every task of one release is a task of the other, with the same arguments: the
    beat, the sweep and the watcher send them positionally (``[tag, force]``), so an
    argument added even with a default reaches a worker of the release without it. A new
    task is registered one release before anything sends it (and listed here then)."""
    previous, current = layouts
    for sender, runner, who in ((previous, current, "previous -> current"),
                                (current, previous, "current -> previous")):
        for task, sig in sender["tasks"].items():
            assert task in runner["tasks"], f"{who}: {task} is not a task of the other release"
            assert runner["tasks"][task] == sig, (
                f"{who}: {task}'s arguments moved: {sig} -> {runner['tasks'][task]}")


def test_the_redis_keys_and_the_settings_are_kept(
    layouts: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    previous, current = layouts
    gone = set(previous["keys"]) - set(current["keys"])
    assert not gone, f"Redis keys of the previous release the current one does not use: {gone}"
    assert previous["scheduled"] == current["scheduled"]
    gone = set(previous["settings"]) - set(current["settings"])
    assert not gone, f"settings of the previous release the current one does not read: {gone}"
