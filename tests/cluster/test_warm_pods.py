"""Warm check pods on a real single-node Kubernetes (docs/warm-checks.md): the check service
on this machine with ``WARM_CHECKS=on`` and the shipped Role; a warm pod per team, image and
settings runs rf-agent, which runs each source's checks in a directory of its own; checks go
to it over the pod network, no API request per check. The warm resource counts its source's
checks in $TMPDIR and what it left in $HOME."""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from testbed.event_sink import event_sink
from testbed.git_daemon import git_daemon
from testbed.git_history import add_commit, make_repository
from testbed.kubernetes import GATEWAY
from tests.cluster.conftest import resource_types
from tests.cluster.timeline import api_requests, audit_entries, percentile
from tests.support.bench import size
from tests.support.events import request_event, send
from tests.support.git_server import git

WARM_LABEL = "resource-functions.dev/warm-check"
PASSWORD = "warm-pod-secret-0b7e"
ROUNDS = size("RF_WARM_ROUNDS", 5, 2)  # checks each way in the warm-check figures
# Checks ask for little CPU, as an operator sizes them on a 2-core node: the whole cluster
# run's node has Knative's and earlier modules' pods on it, and a Job waiting for CPU there
# waited minutes (the default 100m each, with warm pods of earlier tests kept idle).
SMALL_CHECKS = json.dumps(
    {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
)
# Benchmarks (bench): at a smoke size in CI, RF_BENCH=full for bench/README.md's (full / smoke).
GIT_MB = size("RF_WARM_GIT_MB", 30, 2)  # bench/README.md: 300 by hand
GIT_ROUNDS = size("RF_WARM_GIT_ROUNDS", 3, 1)


@pytest.fixture(scope="module")
def warm_deployment(services_in_cluster, cluster_images, tmp_path_factory):
    types = resource_types(cluster_images["warm"])
    tmp = tmp_path_factory.mktemp("warm-pods")
    extra = {"WARM_CHECKS": "on", "TASK_RESOURCES": SMALL_CHECKS}
    with services_in_cluster(types, tmp, extra=extra) as deployed:
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


def test_sources_share_a_pod_never_a_directory_and_another_team_never_the_pod(
    warm_deployment,
):
    source, other = new_source(), new_source()
    first = check(warm_deployment, source, team="a")
    second = check(warm_deployment, source, team="a")
    beside = check(warm_deployment, other, team="a")
    theirs = check(warm_deployment, source, team="b")
    assert (first["count"], first["seen"]) == ("1", "1")
    assert (second["count"], second["seen"]) == ("2", "2")  # its $TMPDIR and $HOME kept
    assert second["container"] == beside["container"] == first["container"]
    assert (beside["count"], beside["seen"]) == ("1", "1")  # in the same pod, its own
    assert beside["home"] != first["home"] and beside["tmp"] != first["tmp"]
    assert first["home"].startswith("/rf/sources/")
    assert theirs["count"] == "1" and theirs["container"] != first["container"]
    kept = names(warm_deployment)
    assert first["container"] in kept and theirs["container"] in kept
    text = json.dumps(warm_pods(warm_deployment))
    assert PASSWORD not in text and source["nonce"] not in text
    assert PASSWORD not in Path(warm_deployment.services.log_path).read_text()
    assert warm_deployment.services.metric("check", "resource_function_warm_reuses_total") == 2


def test_a_steady_check_makes_no_api_request(warm_deployment):
    """Once its pod runs, a check goes to the agent over the pod network: the audit log
    shows no request of the functions' account while ten checks run."""
    source = new_source()
    check(warm_deployment, source)
    cluster = warm_deployment.cluster
    offset = cluster.audit_log.stat().st_size
    for _ in range(10):
        assert "count" in check(warm_deployment, source)
    requests = api_requests(audit_entries(cluster.audit_log, offset))[0]
    assert sum(requests.values()) == 0, requests


def test_the_agent_runs_nothing_without_its_pods_token(warm_deployment):
    """Its port answers 401 to a call without the pod's token, or with another pod's."""
    import requests as http

    from functions.runtimes.warm.agent import PORT, pod_token

    first = check(warm_deployment, new_source(), team="a")
    other = check(warm_deployment, new_source(), team="b")
    pod = next(p for p in warm_pods(warm_deployment) if p["metadata"]["name"] == first["container"])
    url = f"http://{pod['status']['podIP']}:{PORT}/check"
    headers = {"X-RF-Source": "a" * 32, "X-RF-Timeout": "5"}
    secret = warm_deployment.services.env["CACHE_SECRET"].encode()
    for token in ("", "forged" * 4, pod_token(secret, other["container"])):
        answer = http.post(url, headers={**headers, "Authorization": f"Bearer {token}"}, data=b"{}")
        assert answer.status_code == 401, answer.text


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
    assert second["count"] == "1"  # a new pod
    assert second["container"] != first["container"]
    assert uid_of(warm_deployment, second["container"]) not in ("", deleted)
    dead = warm_deployment.services.metric(
        "check", "resource_function_warm_evictions_total", reason="dead"
    )
    assert dead == 1


def names(deployment) -> set[str]:
    return {p["metadata"]["name"] for p in warm_pods(deployment)}


def test_a_full_task_quota_evicts_an_idle_warm_pod_and_the_other_teams_check_runs(
    warm_deployment,
):
    """The task namespace's ResourceQuota full (idle warm pods of team red among what fills
    it): a check of team blue evicts the least recently used idle warm pod, of any team, and
    runs in its own warm pod; before, its pod create was refused and the check failed
    ``Unavailable`` with a message about a missing RBAC verb."""
    deployment, cluster = warm_deployment, warm_deployment.cluster
    red = check(deployment, new_source(), team="red")
    assert red["container"] in names(deployment)
    before = deployment.services.metric(
        "check", "resource_function_warm_evictions_total", reason="quota"
    )
    pods = json.loads(cluster.kubectl("-n", deployment.namespace, "get", "pods", "-o", "json"))
    alive = [p for p in pods["items"] if p["status"].get("phase") in ("Pending", "Running")]
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "warm-test-full", "namespace": deployment.namespace},
        "spec": {"hard": {"pods": str(len(alive))}},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(quota))
    try:
        deadline = time.monotonic() + 60
        while "pods" not in json.loads(
            cluster.kubectl(
                "-n", deployment.namespace, "get", "resourcequota", "warm-test-full", "-o", "json"
            )
        ).get("status", {}).get("used", {}):
            assert time.monotonic() < deadline, "the quota controller never counted the pods"
            time.sleep(0.5)
        blue = check(deployment, new_source(), team="blue")
    finally:
        cluster.kubectl("-n", deployment.namespace, "delete", "resourcequota", "warm-test-full")
    assert blue.get("count") == "1", blue  # it ran, in a warm pod of its own
    assert blue["container"] in names(deployment)
    after = deployment.services.metric(
        "check", "resource_function_warm_evictions_total", reason="quota"
    )
    assert after == before + 1


def test_a_check_over_its_budget_ends_alone(warm_deployment):
    """The agent kills that check's processes; its pod, and another source's directory in
    it, stay."""
    other = new_source()
    kept = check(warm_deployment, other, team="budget")
    failure = check(warm_deployment, {**new_source(), "mode": "hang"}, team="budget", kind="slow")
    assert failure["kind"] == "timeout"
    after = check(warm_deployment, other, team="budget")
    assert (after["count"], after["container"]) == ("2", kept["container"])


@pytest.mark.bench
def test_figures_a_warm_check_against_a_job(
    warm_deployment, services_in_cluster, cluster_images, tmp_path, capsys
):
    """Figures, not asserts (bench/README.md): a check of one resource, five times, as an
    exec in its warm pod and as a Job (a second check service with WARM_CHECKS=off)."""
    source = new_source()
    check(warm_deployment, source)  # its pod starts
    warm = [timed(lambda: check(warm_deployment, source)) for _ in range(ROUNDS)]
    types = resource_types(cluster_images["warm"])
    extra = {"WARM_CHECKS": "off", "TASK_RESOURCES": SMALL_CHECKS}
    with services_in_cluster(types, tmp_path, extra=extra) as jobs:
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


@pytest.mark.bench
def test_figures_a_git_check_in_a_warm_pod_against_a_job(
    warm_deployment, services_in_cluster, cluster_images, real_resource_images, tmp_path, capsys
):
    """Figures, not asserts (bench/README.md): Concourse's git resource checking a generated
    history of ``RF_WARM_GIT_MB`` (a source tree's, testbed/git_history.py) served by ``git
    daemon`` on the gateway, after one new commit each round: in its warm pod, which kept its
    clone (an incremental fetch), and as a Job (a new clone each time). Each check must answer
    the new head."""
    repos = tmp_path / "repos"
    repos.mkdir()
    make_repository(repos / "app.git", GIT_MB, "source")
    with git_daemon(repos, GATEWAY) as port:
        source = {"uri": f"git://{GATEWAY}:{port}/app.git", "branch": "main"}
        types = resource_types(cluster_images["warm"])
        extra = {"WARM_CHECKS": "off", "TASK_RESOURCES": SMALL_CHECKS}
        with services_in_cluster(types, tmp_path / "jobs", extra=extra) as jobs:
            firsts = {}
            rounds: dict[str, list[float]] = {"warm pod": [], "Job": []}
            for n in range(-1, GIT_ROUNDS):
                if n >= 0:
                    add_commit(repos / "app.git", n)
                head = {"ref": git("rev-parse", "main", cwd=repos / "app.git").strip()}
                for way, deployment in (("warm pod", warm_deployment), ("Job", jobs)):
                    started = time.perf_counter()
                    assert check(deployment, source, kind="git") == head
                    took = time.perf_counter() - started
                    if n < 0:
                        firsts[way] = took  # the first clone
                    else:
                        rounds[way].append(took)
    warm, job = statistics.median(rounds["warm pod"]), statistics.median(rounds["Job"])
    with capsys.disabled():
        print(f"\n[warm-pods] git check, {GIT_MB} MiB of history, after one new commit:")
        for way, times in rounds.items():
            print(
                f"  {way:8} first (clone) {firsts[way]:.2f} s, then median "
                f"{statistics.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})"
            )
        print(f"  Job / warm pod: {job / warm:.1f}x")


# The many-resources load (issue 30): by hand 50 resources every 10 s for 300 s.
LOAD_RESOURCES = size("RF_WARM_LOAD_RESOURCES", 10, 2)
LOAD_INTERVAL = float(os.environ.get("RF_WARM_LOAD_INTERVAL", "10"))
LOAD_SECONDS = float(size("RF_WARM_LOAD_SECONDS", 60, 10))
# Jobs fall behind past about a check a second (bench/README.md): by hand, the full size warm only.
LOAD_WAYS = os.environ.get("RF_WARM_LOAD_WAYS", "warm pods,Jobs").split(",")


def load(deployment, sources: list[dict]) -> tuple[list[float], int]:
    """Each source checked every LOAD_INTERVAL for LOAD_SECONDS, the ticks spread evenly over
    the interval; the latencies of the checks answered with a version, and the others."""
    ticks = int(LOAD_SECONDS / LOAD_INTERVAL)
    spacing = LOAD_INTERVAL / len(sources)
    latencies: list[float] = []
    failed = 0
    lock = threading.Lock()

    def one(source: dict) -> None:
        nonlocal failed
        started = time.perf_counter()
        try:
            answer = check(deployment, source)
            ok = "count" in answer
        except AssertionError:
            ok = False
        with lock:
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                failed += 1

    begin = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(sources) * 2) as pool:
        for n in range(ticks * len(sources)):
            time.sleep(max(0.0, begin + n * spacing - time.monotonic()))
            pool.submit(one, sources[n % len(sources)])
    return latencies, failed


def warm_pod_memory(deployment) -> int:
    """The warm pods' memory now (bytes), from their cgroups on this node (cgroup v1)."""
    total = 0
    for pod in warm_pods(deployment):
        uid = pod["metadata"]["uid"]
        for usage in Path("/sys/fs/cgroup/memory").glob(f"kubepods*/**/pod{uid}"):
            total += int((usage / "memory.usage_in_bytes").read_text())
            break
    return total


@pytest.mark.bench
def test_figures_many_resources_checked_in_warm_pods_and_as_jobs(
    services_in_cluster, cluster_images, cluster, tmp_path, capsys
):
    """Figures, not asserts (bench/README.md): LOAD_RESOURCES resources of one team, each
    checked every LOAD_INTERVAL s for LOAD_SECONDS through the check service, in warm pods
    (the team's caps raised to fit them and the checks' CPU requests made small, as an
    operator does; both ways alike) and as Jobs: checks per minute,
    latency p50/p95, the functions' API requests per check (the audit log) and the warm pods'
    memory. Every check must be answered with a version."""
    types = resource_types(cluster_images["warm"])
    room = str(LOAD_RESOURCES * 2)
    figures = {}
    ways = {
        "warm pods": {"WARM_CHECKS": "on", "WARM_CHECKS_PER_TEAM": room},
        "Jobs": {"WARM_CHECKS": "off"},
    }
    assert set(LOAD_WAYS) <= set(ways), f"RF_WARM_LOAD_WAYS: {LOAD_WAYS} not in {list(ways)}"
    for way, extra in ((way, ways[way]) for way in LOAD_WAYS):
        extra = {
            **extra,
            "MAX_RUNS_PER_TEAM": room,
            "WARM_CHECKS_PER_REPLICA": room,
            "TASK_RESOURCES": SMALL_CHECKS,  # the node's 2 CPUs: as an operator sizes checks
        }
        with services_in_cluster(types, tmp_path / way.replace(" ", "-"), extra=extra) as d:
            sources = [new_source() for _ in range(LOAD_RESOURCES)]
            if way == "warm pods":
                for source in sources:  # their pods start: the load measures the reuse
                    check(d, source)
            offset = cluster.audit_log.stat().st_size
            started = time.monotonic()
            latencies, failed = load(d, sources)
            took = time.monotonic() - started
            requests = api_requests(audit_entries(cluster.audit_log, offset))[0]
            memory = warm_pod_memory(d) if way == "warm pods" else 0
        figures[way] = (latencies, failed, took, requests, memory)
    with capsys.disabled():
        offered = LOAD_RESOURCES * 60 / LOAD_INTERVAL
        print(
            f"\n[warm-pods] {LOAD_RESOURCES} resources every {LOAD_INTERVAL:.0f} s for "
            f"{LOAD_SECONDS:.0f} s (offered {offered:.0f} checks/min):"
        )
        for way, (latencies, failed, took, requests, memory) in figures.items():
            p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
            per_check = sum(requests.values()) / max(1, len(latencies))
            top = ", ".join(f"{v} {r} {n}" for (v, r), n in requests.most_common(4))
            print(
                f"  {way:9} {len(latencies) * 60 / took:6.1f} checks/min, {failed} failed, "
                f"p50 {p50:.2f} s p95 {p95:.2f} s (p95/p50 {p95 / p50:.2f}), "
                f"API requests per check {per_check:.2f} ({top})"
                + (f", warm pods' memory {memory / 2**20:.1f} MiB" if memory else "")
            )
    for latencies, failed, *_ in figures.values():
        assert failed == 0 and len(latencies) == int(LOAD_SECONDS / LOAD_INTERVAL) * LOAD_RESOURCES


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_an_async_warm_checks_reply_outlives_its_service(
    warm_deployment, services_in_cluster, cluster_images, tmp_path
):
    """A Knative replica scaled down or killed right after its 202 leaves no reply owed:
    a warm check runs in its request and posts its reply before the 202 (docs/warm-checks.md).
    The service is killed (SIGKILL, workers first) the moment the 202 comes; the sink has the
    reply. Its pod's first start takes seconds: a reply left to the background was lost."""
    before = names(warm_deployment)
    types = resource_types(cluster_images["warm"])
    with event_sink() as sink:
        extra = {"WARM_CHECKS": "on", "TASK_RESOURCES": SMALL_CHECKS, "K_SINK": sink.url}
        extra["HOSTNAME"] = "async-replica"  # a replica of its own: its pods apart
        with services_in_cluster(types, tmp_path, extra=extra) as deployed:
            data = {"type": "test", "source": new_source(), "build": {"team": "async"}}
            event = request_event("check", data, replymode="async")
            status, _, response = send(deployed.services.urls["check"], event, timeout=180)
            for proc in deployed.services.procs:
                for pid in [*children(proc.pid), proc.pid]:
                    os.kill(pid, signal.SIGKILL)
                proc.wait(10)
            replies = sink.drain()
    left = names(warm_deployment) - before
    if left:
        warm_deployment.cluster.kubectl(
            "-n", warm_deployment.namespace, "delete", "pod", "--wait=false", *left
        )
    assert status == 202, response.text
    ends = [e for e in replies if e.get_type() == "dev.resourcefunctions.check.succeeded"]
    assert [e.get_extension("requestid") for e in ends] == [event.get_id()]
    assert ends[0].get_data()["versions"][-1]["count"] == "1"
    assert left, "the killed service's warm pod should have been left behind"


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_sigterm_leaves_no_warm_pod(warm_deployment):
    check(warm_deployment, new_source())
    assert warm_pods(warm_deployment)
    warm_deployment.services.stop()  # SIGTERM: the drain deletes them
    assert warm_pods(warm_deployment) == []
