"""The shipped alerts (knative/monitoring/): promtool checks the rule file and runs one unit
test file per alert (tests/monitoring/<alert>.yaml: series that fire it and series that do
not); the PrometheusRule holds the same groups; every metric the rules read is one the
services export; the Prometheus Operator objects have the shape the operator's CRDs take."""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from functions.metrics import Metrics
from tests.support.strict_schema import strict_schema

REPO = Path(__file__).resolve().parents[2]
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


def exported_series() -> set[str]:
    """Every series name the services' metrics expose (histograms: _bucket, _count, _sum)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes[family.type]
    }


def test_rules_read_only_metrics_the_services_export() -> None:
    read = {
        name
        for group in groups()
        for rule in group["rules"]
        for name in METRIC.findall(rule["expr"])
    }
    assert read and read <= exported_series(), sorted(read - exported_series())


def test_the_prometheusrule_holds_the_rule_files_groups() -> None:
    (rule,) = operator_docs("PrometheusRule")
    assert rule["spec"] == {"groups": groups()}, (
        "prometheusrule.yaml's spec must be rules.yaml's groups: copy them over"
    )


def operator_docs(kind: str) -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(MONITORING.glob("*.yaml"))
        if path != RULES
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == kind
    ]


@functools.cache
def operator_schema(plural: str) -> dict[str, Any]:
    """The strict schema of a Prometheus Operator kind's v1, from CRDs generated from the
    operator's API types (testbed/build_prometheus_operator_crds.sh; .ci/setup runs it)."""
    done = subprocess.run(
        ["bash", str(REPO / "testbed/build_prometheus_operator_crds.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot generate the Prometheus Operator CRDs:\n{done.stderr[-3000:]}")
    crd = yaml.safe_load(
        (Path(done.stdout.strip()) / f"monitoring.coreos.com_{plural}.yaml").read_text()
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict_schema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # the API server checks it
    return schema


@pytest.mark.parametrize(
    ("kind", "plural"), [("PrometheusRule", "prometheusrules"), ("PodMonitor", "podmonitors")]
)
def test_operator_objects_validate_against_their_crds(kind: str, plural: str) -> None:
    docs = operator_docs(kind)
    validator = jsonschema.Draft7Validator(operator_schema(plural))
    for doc in docs:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
        assert not errors, "\n".join(errors)
    misspelled = copy.deepcopy(docs[0])
    misspelled["spec"]["selectr"] = {}
    assert list(validator.iter_errors(misspelled)), "the strict schema must refuse unknown fields"


PODMONITOR = "resource-functions"


def test_podmonitor_selects_the_function_pods() -> None:
    (monitor,) = [d for d in operator_docs("PodMonitor") if d["metadata"]["name"] == PODMONITOR]
    services = [
        doc
        for doc in yaml.safe_load_all((REPO / "knative" / "services.yaml").read_text())
        if doc and doc["kind"] == "Service" and doc["metadata"]["name"] in {"check", "get", "put"}
    ]
    selector = monitor["spec"]["selector"]
    (components,) = selector["matchExpressions"]
    for service in services:
        labels = service["spec"]["template"]["metadata"]["labels"]
        assert selector["matchLabels"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] in components["values"]
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "user-port", "path": "/metrics", "interval": "30s"}
    ]


def test_a_podmonitor_scrapes_the_tekton_controllers_metrics_port() -> None:
    (monitor,) = [
        d for d in operator_docs("PodMonitor") if d["metadata"]["name"] == f"{PODMONITOR}-tekton"
    ]
    (deployment,) = [
        doc
        for doc in yaml.safe_load_all((REPO / "knative" / "tekton" / "controller.yaml").read_text())
        if doc and doc["kind"] == "Deployment"
    ]
    template = deployment["spec"]["template"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = template["spec"]["containers"]
    assert endpoint["port"] in {p.get("name") for p in container["ports"]}


def test_monitoring_kustomization_renders() -> None:
    kustomize = shutil.which("kustomize")
    command = [kustomize, "build"] if kustomize else ["kubectl", "kustomize"]
    if not shutil.which(command[0]):
        pytest.fail("neither kustomize nor kubectl is installed (.ci/setup installs kustomize)")
    done = subprocess.run(
        [*command, str(MONITORING)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    rendered = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert sorted(doc["kind"] for doc in rendered) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    for doc in rendered:
        assert doc["metadata"]["namespace"] == "resource-functions"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "resource-functions"
