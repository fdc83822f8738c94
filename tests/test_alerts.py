"""The Prometheus alert rules (ops/prometheus/alerts.yml): valid (``promtool check rules``),
doing what their unit tests with input series say (``promtool test rules``,
ops/prometheus/alerts.test.yml), loaded by the shipped Prometheus config, and naming only
metrics leafpool exports. promtool comes from Debian's ``prometheus`` package (``./dev test``
installs it): missing, the test skips saying so, and fails under CI=true."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from leafpool.metrics import METRIC_NAMES
from tests.support.services import unavailable

OPS = Path(__file__).resolve().parents[1] / "ops" / "prometheus"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is not installed (Debian package prometheus; `./dev test` "
                    "installs it)")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=OPS, capture_output=True, text=True, timeout=120)


def test_the_rules_are_valid_and_their_unit_tests_pass(promtool: str) -> None:
    checked = _run(promtool, "check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout
    tested = _run(promtool, "test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    config = _run(promtool, "check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 5 rules found" in config.stdout + config.stderr  # alerts.yml loaded


def test_every_rule_is_unit_tested_and_names_exported_metrics() -> None:
    rules = yaml.safe_load((OPS / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert names == {"LeafpoolDatabaseDown", "LeafpoolPoolRunningOut", "LeafpoolCounterBehind",
                     "LeafpoolCounterHealed", "LeafpoolRedisUnreachable"}
    tests = yaml.safe_load((OPS / "alerts.test.yml").read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    assert tested == names
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"]
              if case["exp_alerts"]}
    assert firing == names  # each is seen firing, not only quiet
    used = {re.sub(r"_total$", "", n) for rule in rules
            for n in re.findall(r"\bleafpool_[a-z_]+", rule["expr"])}
    assert used and used <= set(METRIC_NAMES)
