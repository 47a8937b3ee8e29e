"""The kubernetes runtime's shared pod watch (``functions/runtimes/kube/pod_watch.py``), against
kmock's emulator over HTTP as in ``test_kubernetes_runtime.py`` (whose fixtures and node
scripts these tests use): one list and one watch for many runs, lists again after 410 Gone,
after each watch's expiry and after an API error, reads the Job when no pod event comes, and
wakes its followers at close."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from functions.errors import Unavailable
from functions.model import Outcome
from tests.support.kube_emulator import Cluster, api, cluster
from tests.support.kube_node import (
    NAMESPACE,
    RUNNING,
    Node,
    container_status,
    make_runtime,
    make_task,
    node,
    store,
)

__all__ = ["api", "cluster", "make_runtime", "node", "store"]  # fixtures


def finish_all(count: int, until: Any = None) -> Any:
    """A node script: once ``count`` Jobs exist (and ``until()`` holds, if given), each one's
    pod runs, its real collect step records a check's versions and the Job completes."""

    def script(node: Node) -> None:
        end = time.monotonic() + 20
        while len(jobs := node.batch.list_namespaced_job(NAMESPACE).items) < count:
            assert time.monotonic() < end, "the runs did not create their Jobs"
            time.sleep(0.05)
        if until is not None:
            node.wait_until(until, "what the runs waited for")
        for listed in jobs:
            job = node.api_client.sanitize_for_serialization(listed)
            secret = node.wait_secret(job)
            pod = node.create_pod(job)
            node.pod_status(pod, "Pending", [container_status("resource", RUNNING)])
            files = {"exit-code": b"0\n", "stdout": b'[{"ref": "1"}]', "stderr": b""}
            assert node.run_step(job, "collect", secret, files) == 0
            node.succeed(pod, job)

    return script


def run_all(runtime: Any, count: int) -> tuple[list[Outcome], float]:
    """``count`` checks run at once (each its own request); their outcomes and wall time."""
    outcomes: list[Outcome] = []
    started = time.monotonic()
    threads = [
        threading.Thread(target=lambda: outcomes.append(runtime.run(make_task("check"))))
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes, time.monotonic() - started


def test_runs_followed_at_once_share_one_list_and_one_watch(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    runtime = make_runtime(watch_seconds=30)
    thread = node.play(finish_all(6))
    outcomes, _ = run_all(runtime, 6)
    node.check(thread)
    assert len(outcomes) == 6 and all(o.data == {"versions": [{"ref": "1"}]} for o in outcomes)
    assert len(cluster.requests("list", "pods")) == 1
    assert len(cluster.requests("watch", "pods")) == 1
    # Per run: create the Job and its Secret, delete the Secret; the Job is read again only
    # when its pods tell nothing for watch_seconds, or one failed.
    assert len(cluster.requests("create", "jobs")) == 6
    assert len(cluster.requests("delete", "secrets")) == 6
    assert cluster.requests("fetch", "jobs") == []


def test_the_shared_watch_lists_again_after_410_gone_and_each_expiry(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    cluster.emulator.gone_watches = 2

    def relisted() -> bool:  # first, after each 410, after two expiries (the pods wait)
        return len(cluster.requests("list", "pods")) >= 5

    runtime = make_runtime(watch_seconds=0.5)
    thread = node.play(finish_all(3, until=relisted))
    outcomes, seconds = run_all(runtime, 3)
    node.check(thread)
    assert len(outcomes) == 3 and all(o.succeeded for o in outcomes)
    lists, watches = len(cluster.requests("list", "pods")), len(cluster.requests("watch", "pods"))
    assert lists >= 5 and watches >= 5
    # One list and one watch at a time for the three runs: a cycle lasts a watch's 0.5 s
    # at least, unless a 410 ends it at once.
    assert lists <= seconds / 0.5 + 2 + 1, (lists, seconds)
    assert watches <= lists


def test_the_watch_tries_again_after_an_api_error(
    make_runtime: Any, node: Node, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    (
        cluster.emulator["get", f"/api/v1/namespaces/{NAMESPACE}/pods"][:1]
        << 500
        << {"kind": "Status", "apiVersion": "v1", "code": 500, "message": "etcd is away"}
    )
    runtime = make_runtime()
    # The pod waits for the watch that follows the list after the error's pause (else the
    # run may end first: its Job is read once its pods told nothing for watch_seconds).
    thread = node.play(finish_all(1, until=lambda: bool(cluster.requests("watch", "pods"))))
    with caplog.at_level("WARNING", logger="functions.kubernetes"):
        outcomes, _ = run_all(runtime, 1)
    node.check(thread)
    assert len(outcomes) == 1 and outcomes[0].succeeded
    warned = [
        r for r in caplog.records if r.getMessage() == "cannot watch the task pods; trying again"
    ]
    assert warned and "etcd is away" in warned[0].fields["error"]  # type: ignore[attr-defined]
    assert len(cluster.requests("list", "pods")) >= 2


def test_a_job_deleted_without_a_pod_event_is_seen_by_reading_it(
    make_runtime: Any, node: Node, cluster: Cluster, api: Any
) -> None:
    """The pod stays (kmock has no garbage collector) and shows no change: the follower
    reads the Job once its pods have told nothing for watch_seconds."""

    def script(node: Node) -> None:
        job = node.wait_job()
        pod = node.create_pod(job)
        node.pod_status(pod, "Running", [container_status("resource", RUNNING)])
        time.sleep(0.3)
        client.BatchV1Api(api).delete_namespaced_job(job["metadata"]["name"], NAMESPACE)

    thread = node.play(script)
    started = time.monotonic()
    outcome = make_runtime(watch_seconds=1.0).run(make_task("check"))
    node.check(thread)
    assert time.monotonic() - started < 5
    assert outcome.failure is not None and "deleted before it finished" in outcome.failure.message
    assert len(cluster.requests("fetch", "jobs")) >= 1
    assert len(cluster.requests("watch", "pods")) <= 3


def test_close_wakes_the_runs_it_follows(make_runtime: Any, node: Node, cluster: Cluster) -> None:
    runtime = make_runtime(watch_seconds=30)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            runtime.run(make_task("check", request_id=str(uuid.uuid4())))
        except Unavailable as err:
            raised.append(err)

    follower = threading.Thread(target=run)
    follower.start()
    while not cluster.requests("watch", "pods"):
        time.sleep(0.05)
    started = time.monotonic()
    runtime.close()
    follower.join(10)
    assert not follower.is_alive() and time.monotonic() - started < 5
    assert raised and "closed while following" in str(raised[0])
