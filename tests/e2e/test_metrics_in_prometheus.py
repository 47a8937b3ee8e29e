"""The services' metrics as a real Prometheus (Debian's 2.42) scrapes them: after a known
set of requests (checks, a failing check, a get that misses then hits, a redelivery, a put
that fails with kind ``storage`` and one that succeeds, a request answered 503), every
metric docs/observability.md lists exists with exactly the labels it names and the values the requests
imply, no label value is unbounded, and every panel of the shipped dashboard returns data."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from cloudevents.core.bindings.http import to_binary_event

from functions.cli.launch import free_port
from functions.model import ACTIONS, FAILURE_KINDS
from functions.runtimes.warm.pool import REASONS
from storage import open_store
from storage.artifacts import add_team
from testbed.process import ServerError
from testbed.prometheus import Prometheus, start_prometheus
from tests.support.events import request_event, send
from tests.support.services import REPO, start_services

METRICS_DOC = REPO / "docs" / "observability.md"  # its metrics table
DASHBOARD = REPO / "knative" / "monitoring" / "dashboard.json"
METRIC_ROW = re.compile(
    r"^\| `(resource_function_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|"
)
RUN_ID = re.compile(r"[0-9a-f]{32}")


def readme_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels) of every metric in docs/observability.md's table."""
    rows = {}
    for line in METRICS_DOC.read_text().splitlines():
        match = METRIC_ROW.match(line)
        if match:
            rows[match[1]] = (match[2], frozenset(re.findall(r"`([a-z_]+)`", match[3])))
    return rows


@dataclass
class Scraped:
    prometheus: Prometheus
    store_url: str
    image: str


def kubeconfig_nowhere(path: Path) -> Path:
    """A cluster that refuses connections: ((var)) lookups through it are 503s."""
    server = f"http://127.0.0.1:{free_port()}"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def ask(services: Any, action: str, data: dict[str, Any], event_id: str | None = None) -> Any:
    status, reply, _ = send(services.urls[action], request_event(action, data, event_id=event_id))
    return status, reply.get_data() if reply is not None else None


@pytest.fixture(scope="module")
def scraped(docker_host, resource_image, tmp_path_factory) -> Iterator[Scraped]:
    tmp = tmp_path_factory.mktemp("prometheus-e2e")
    (tmp / "store").mkdir()
    types = {
        "test": resource_image,
        "paced": {"image": resource_image, "check_every": 0.5},
    }
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps(types),
        "CACHE_SECRET": "metrics-e2e",
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
        "CREDENTIALS_PROVIDER": "kubernetes",
        "KUBECONFIG": str(kubeconfig_nowhere(tmp / "kubeconfig")),
    }
    services = start_services(env, tmp / "services.log")
    try:
        jobs = {action: url.removeprefix("http://") for action, url in services.urls.items()}
        with start_prometheus(jobs, tmp / "prometheus") as prometheus:
            run_scenario(services, env["STORE_URL"])
            # Every scrape has caught up once the last counters show.
            prometheus.wait_for("sum(resource_function_requests_total)", 11)
            prometheus.wait_for("sum(resource_function_runs_total)", 7)
            # ... and twice, so that rates (the dashboard's) have two samples of each series.
            prometheus.wait_for("count(count_over_time(resource_function_runs_total[5m]) > 1)", 5)
            prometheus.wait_for(
                "count(count_over_time(resource_function_requests_total[5m]) > 1)", 4
            )
            yield Scraped(prometheus, env["STORE_URL"], resource_image)
    except ServerError as err:
        pytest.fail(str(err), pytrace=False)
    finally:
        services.stop()


def run_scenario(services: Any, store_url: str) -> None:
    """11 requests: 7 runs (3 checks succeeded, 1 resource_failed, 1 get, 1 put storage,
    1 put succeeded), a cache hit, a redelivery, a 503 and a stop."""
    assert ask(services, "check", {"type": "test", "source": {}})[0] == 200
    paced = {"type": "paced", "source": {"count": 2}}
    assert ask(services, "check", paced)[0] == 200
    time.sleep(1)  # past the paced type's check_every: the next check runs and is observed
    assert ask(services, "check", paced)[0] == 200
    status, failed = ask(services, "check", {"type": "test", "source": {"mode": "fail"}})
    assert status == 200 and failed["error"]["kind"] == "resource_failed"
    get = {"type": "test", "source": {}, "version": {"ref": "1"}}
    first = str(uuid.uuid4())
    status, fetched = ask(services, "get", get, event_id=first)
    assert status == 200 and fetched["cached"] is False
    assert ask(services, "get", get, event_id=first)[1] == fetched  # a redelivery: joined
    status, hit = ask(services, "get", get)
    assert status == 200 and hit["cached"] is True
    missing = f"{store_url.rstrip('/')}/artifacts/{'0' * 64}.tar.zst"
    # An artifact of this team (no team) that has gone: the put runs and its stage fails.
    add_team(open_store(store_url), f"artifacts/{'0' * 64}.tar.zst", "")
    put = {"type": "test", "source": {}, "params": {"input": "in"}}
    status, lost = ask(services, "put", {**put, "inputs": {"in": missing}})
    assert status == 200 and lost["error"]["kind"] == "storage"
    status, pushed = ask(services, "put", {**put, "inputs": {"in": fetched["artifact"]["url"]}})
    assert status == 200 and pushed["version"] == {"ref": "pushed-1"}
    secret = {"type": "test", "source": {"password": "((token))"}, "build": {"team": "main"}}
    assert ask(services, "check", secret)[0] == 503
    stop = request_event("put", {}, event_id=f"stop-{uuid.uuid4()}", stops=str(uuid.uuid4()))
    message = to_binary_event(stop)
    stopped = requests.post(
        services.urls["put"], headers=dict(message.headers), data=message.body, timeout=30
    )
    assert (stopped.status_code, stopped.content) == (200, b"")


def series(prometheus: Prometheus, name: str, kind: str) -> list[dict[str, str]]:
    """The label sets of a metric's series (a histogram's through its _count)."""
    queried = f"{name}_count" if kind == "histogram" else name
    return [s["metric"] for s in prometheus.query(f'{{__name__="{queried}"}}')]


def test_the_readme_lists_the_metrics() -> None:
    assert len(readme_metrics()) >= 12, "docs/observability.md's metric table was not found"


@pytest.mark.parametrize("name", sorted(readme_metrics()))
def test_every_readme_metric_is_scraped_with_the_labels_it_names(scraped, name) -> None:
    kind, labels = readme_metrics()[name]
    found = series(scraped.prometheus, name, kind)
    assert found, f"{name}: no series scraped"
    for metric in found:
        assert set(metric) - {"__name__", "job", "instance"} == labels, metric


EXPECTED = {  # what the scenario's requests imply
    'resource_function_requests_total{action="check",status="200"}': 4,
    'resource_function_requests_total{action="check",status="503"}': 1,
    'resource_function_requests_total{action="get",status="200"}': 3,
    'resource_function_requests_total{action="put",status="200"}': 3,
    'resource_function_runs_total{action="check",outcome="succeeded"}': 3,
    'resource_function_runs_total{action="check",outcome="resource_failed"}': 1,
    'resource_function_runs_total{action="get",outcome="succeeded"}': 1,
    'resource_function_runs_total{action="put",outcome="storage"}': 1,
    'resource_function_runs_total{action="put",outcome="succeeded"}': 1,
    'resource_function_run_duration_seconds_count{action="check"}': 4,
    'resource_function_run_duration_seconds_count{action="get"}': 1,
    'resource_function_run_duration_seconds_count{action="put"}': 2,
    'resource_function_run_phase_seconds_count{action="get",phase="script"}': 1,
    'resource_function_run_phase_seconds_count{action="get",phase="upload"}': 1,
    'resource_function_run_phase_seconds_count{action="put",phase="stage"}': 2,
    'resource_function_cache_hits_total{action="get"}': 1,
    'resource_function_cache_misses_total{action="get"}': 1,
    'resource_function_joined_runs_total{action="get"}': 1,
    'resource_function_stops_total{action="put"}': 1,
    'resource_function_check_age_intervals_count{type="paced"}': 1,
    'resource_function_check_leases_held{job="check"}': 0,
    'resource_function_check_lease_waiters{job="check"}': 0,
    'resource_function_tasks_waiting{action="check"}': 0,
    'resource_function_tasks_waiting{action="get"}': 0,
    # Warm checks: three resources checked (test, paced, the failing one), paced twice: one
    # team and one image, so one warm container, each resource in a directory of its own.
    'resource_function_warm_containers{job="check"}': 1,
    'resource_function_warm_sources{job="check"}': 3,
    'resource_function_warm_starts_total{job="check"}': 1,
    'resource_function_warm_reuses_total{job="check"}': 3,
    'resource_function_warm_evictions_total{job="check"}': 0,
}


@pytest.mark.parametrize("expr", sorted(EXPECTED))
def test_values_are_what_the_requests_imply(scraped, expr) -> None:
    assert scraped.prometheus.value(f"sum({expr})") == EXPECTED[expr]


def test_artifact_bytes_and_store_calls_are_counted(scraped) -> None:
    stored = scraped.prometheus.value('sum(resource_function_artifact_bytes_total{action="get"})')
    assert stored > 0
    for operation in ("put", "open", "stat", "read_record", "write_record"):
        calls = (
            f'sum(resource_function_store_seconds_count{{backend="file",operation="{operation}"}})'
        )
        assert scraped.prometheus.value(calls) > 0, operation
    assert scraped.prometheus.value("sum(resource_function_check_age_intervals_sum)") >= 1


BOUNDED = {
    "action": set(ACTIONS),
    "status": {"200", "202", "400", "401", "403", "503"},
    "outcome": {"succeeded", *FAILURE_KINDS},  # a run's outcome: success or a failure kind
    "phase": {"image_pull", "stage", "create", "script", "output", "upload", "history", "store"},
    "type": {"test", "paced", "(image)"},
    "reason": set(REASONS),
    "backend": {"file", "s3", "gcs"},
    "operation": {"put", "open", "stat", "delete", "list", "read_record", "write_record"},
    "le": None,  # histogram buckets: the code's fixed boundaries
    "job": set(ACTIONS),
    "instance": None,
}


def test_no_label_value_is_unbounded(scraped) -> None:
    found = scraped.prometheus.query('{__name__=~"resource_function_.+"}')
    assert found
    for sample in found:
        for label, value in sample["metric"].items():
            if label == "__name__":
                continue
            assert label in BOUNDED, f"unexpected label {label} on {sample['metric']}"
            allowed = BOUNDED[label]
            assert allowed is None or value in allowed, f"{label}={value!r}"
            assert not RUN_ID.search(value) and scraped.image not in value


def dashboard_queries() -> list[Any]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [
        pytest.param(target["expr"], id=f"{panel['title']}/{target['refId']}")
        for panel in panels
        for target in panel["targets"]
    ]


@pytest.mark.parametrize("expr", dashboard_queries())
def test_every_dashboard_query_returns_data(scraped, expr) -> None:
    # Grafana's $__rate_interval: the whole scenario fits in 5 minutes.
    result = scraped.prometheus.query(expr.replace("$__rate_interval", "5m"))
    assert result, f"no data: {expr}"
