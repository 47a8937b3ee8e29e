"""Warm check pods on a real single-node Kubernetes (docs/warm-checks.md): the check service
on this machine with ``WARM_CHECKS=on`` and the shipped Role (pods/exec in the task namespace
only); the warm resource counts the checks run in its container in $TMPDIR."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import resource_types
from tests.support.events import request_event, send

WARM_LABEL = "resource-functions.dev/warm-check"
PASSWORD = "warm-pod-secret-0b7e"
ROUNDS = 5


@pytest.fixture(scope="module")
def warm_deployment(services_in_cluster, cluster_images, tmp_path_factory):
    types = resource_types(cluster_images["warm"])
    tmp = tmp_path_factory.mktemp("warm-pods")
    with services_in_cluster(types, tmp, extra={"WARM_CHECKS": "on"}) as deployed:
        yield deployed


def check(deployment, source: dict[str, Any], team: str = "", kind: str = "test") -> dict:
    data: dict[str, Any] = {"type": kind, "source": source}
    if team:
        data["build"] = {"team": team}
    status, reply, response = send(
        deployment.services.urls["check"], request_event("check", data), timeout=180
    )
    assert status == 200, response.text
    answer = reply.get_data()
    return answer.get("error") or answer["versions"][-1]


def warm_pods(deployment) -> list[dict]:
    out = deployment.cluster.kubectl(
        "-n", deployment.namespace, "get", "pods", "-l", WARM_LABEL, "-o", "json"
    )
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def new_source() -> dict[str, str]:
    return {"nonce": uuid.uuid4().hex, "password": PASSWORD}


def test_the_second_check_runs_in_the_same_pod_and_another_team_never(warm_deployment):
    source = new_source()
    first = check(warm_deployment, source, team="a")
    second = check(warm_deployment, source, team="a")
    theirs = check(warm_deployment, source, team="b")
    assert first["count"] == "1"
    assert second == {"count": "2", "container": first["container"]}  # $TMPDIR remembered
    assert theirs["count"] == "1" and theirs["container"] != first["container"]
    kept = names(warm_deployment)
    assert first["container"] in kept and theirs["container"] in kept
    text = json.dumps(warm_pods(warm_deployment))
    assert PASSWORD not in text and source["nonce"] not in text
    assert PASSWORD not in Path(warm_deployment.services.log_path).read_text()
    assert warm_deployment.services.metric("check", "resource_function_warm_reuses_total") == 1


def uid_of(deployment, pod: str) -> str:
    return deployment.cluster.kubectl(
        "-n", deployment.namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}"
    )


def test_a_deleted_warm_pod_is_replaced_without_a_failure(warm_deployment):
    source = new_source()
    first = check(warm_deployment, source)
    deleted = uid_of(warm_deployment, first["container"])
    warm_deployment.cluster.kubectl(
        "-n", warm_deployment.namespace, "delete", "pod", first["container"], "--wait=true"
    )
    second = check(warm_deployment, source)
    assert second["count"] == "1"  # a new pod (of the same name: its key's and replica's)
    assert uid_of(warm_deployment, second["container"]) not in ("", deleted)
    dead = warm_deployment.services.metric(
        "check", "resource_function_warm_evictions_total", reason="dead"
    )
    assert dead == 1


def names(deployment) -> set[str]:
    return {p["metadata"]["name"] for p in warm_pods(deployment)}


def test_a_check_over_its_budget_ends_with_its_pod(warm_deployment):
    before = names(warm_deployment)
    failure = check(warm_deployment, {**new_source(), "mode": "hang"}, kind="slow")
    assert failure["kind"] == "timeout"
    assert names(warm_deployment) == before  # its pod, with every process in it, is gone
    budget = warm_deployment.services.metric(
        "check", "resource_function_warm_evictions_total", reason="budget"
    )
    assert budget == 1


def test_figures_a_warm_check_against_a_job(
    warm_deployment, services_in_cluster, cluster_images, tmp_path, capsys
):
    """Figures, not asserts (bench/README.md): a check of one resource, five times, as an
    exec in its warm pod and as a Job (a second check service with WARM_CHECKS=off)."""
    source = new_source()
    check(warm_deployment, source)  # its pod starts
    warm = [timed(lambda: check(warm_deployment, source)) for _ in range(ROUNDS)]
    types = resource_types(cluster_images["warm"])
    with services_in_cluster(types, tmp_path, extra={"WARM_CHECKS": "off"}) as jobs:
        job = [timed(lambda: check(jobs, source)) for _ in range(ROUNDS)]
    assert len(warm) == len(job) == ROUNDS  # every check answered (check() asserts a 200)
    ratio = statistics.median(job) / statistics.median(warm)
    with capsys.disabled():
        print(
            f"\n[warm-pods] check in its warm pod: median {statistics.median(warm):.3f} s "
            f"({', '.join(f'{t:.2f}' for t in warm)}); as a Job: median "
            f"{statistics.median(job):.3f} s ({', '.join(f'{t:.2f}' for t in job)}); "
            f"Job / warm: {ratio:.1f}x"
        )


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_sigterm_leaves_no_warm_pod(warm_deployment):
    check(warm_deployment, new_source())
    assert warm_pods(warm_deployment)
    warm_deployment.services.stop()  # SIGTERM: the drain deletes them
    assert warm_pods(warm_deployment) == []
