"""The shipped alerts (knative/monitoring/): promtool checks the rule file and runs one unit
test file per alert (tests/monitoring/<alert>.yaml: series that fire it and series that do
not); the PrometheusRule holds the same groups; every metric the rules read is one the
services export; the Prometheus Operator objects have the shape the operator's CRDs take."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "knative" / "monitoring"
RULES = MONITORING / "rules.yaml"
RULE_TESTS = sorted((REPO / "tests" / "monitoring").glob("*.yaml"))
METRIC = re.compile(r"\b(resource_function_[a-z_]+)")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed (.ci/setup installs Debian's prometheus)")
    return found


def groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text())["groups"])


def alerts() -> list[dict[str, Any]]:
    return [rule for group in groups() for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rule_file() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups())} rules found" in done.stdout


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests_pass(path: Path) -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _cases(alert: str) -> tuple[int, int]:
    """How many unit-test evaluations expect ``alert`` to fire, and how many expect not."""
    fires = quiet = 0
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case["alertname"] == alert:
                    fires += bool(case["exp_alerts"])
                    quiet += not case["exp_alerts"]
    return fires, quiet


@pytest.mark.parametrize("alert", [rule["alert"] for rule in alerts()])
def test_every_alert_has_a_case_that_fires_and_one_that_does_not(alert: str) -> None:
    fires, quiet = _cases(alert)
    assert fires and quiet, f"{alert}: {fires} firing and {quiet} quiet cases in tests/monitoring/"


def test_every_alert_says_what_and_how_bad() -> None:
    for rule in alerts():
        assert re.fullmatch(r"ResourceFunction[A-Z][A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description"} <= set(rule["annotations"])


def test_rules_read_only_metrics_the_services_export() -> None:
    exported = {
        sample.name
        for family in Metrics().registry.collect()
        for sample in _samples_and_names(family)
    }
    read = {
        name
        for group in groups()
        for rule in group["rules"]
        for name in METRIC.findall(rule["expr"])
    }
    assert read and read <= exported, sorted(read - exported)


def _samples_and_names(family: Any) -> Any:
    """Every series name a family exposes (histograms: _bucket, _count, _sum), even unused."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    for suffix in suffixes.get(family.type, ("",)):
        yield type("Name", (), {"name": family.name + suffix})


def test_the_prometheusrule_holds_the_rule_files_groups() -> None:
    (rule,) = _operator_docs("PrometheusRule")
    assert rule["spec"] == {"groups": groups()}, (
        "prometheusrule.yaml's spec must be rules.yaml's groups: copy them over"
    )


def _operator_docs(kind: str) -> list[dict[str, Any]]:
    docs = [
        doc
        for path in MONITORING.glob("*.yaml")
        if path != RULES
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == kind
    ]
    return docs
