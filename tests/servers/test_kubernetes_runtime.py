"""The kubernetes runtime against kmock's stateful KubernetesEmulator over HTTP, through the
official client, with a real S3 server (versitygw) for artifacts and results.

No cluster runs here, so a test thread plays the node (kubelet and Job controller): it waits
for the Job, creates its pod, advances the pod's status, runs the REAL collect step (the
Job's own collect command, through the CLI, with the stdin read from the Secret the runtime
created) and marks the Job complete. kmock stores what it is sent without validation and
ignores label selectors and watch timeouts; the Job it stores is checked against the schema.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client

from functions import keys
from functions.cli.launch import wait_until
from functions.errors import RequestIdReused, RunStopped, Unavailable
from functions.kube.api import Rejected, belongs, translate
from functions.ledger import lease, results, tombstones
from functions.model import LeaseHold, Task
from functions.runtimes.kube.job_status import judge
from functions.runtimes.kube.kubernetes import KubernetesRuntime
from functions.settings import Settings
from functions.steps.pod_contract import CollectStep, StepFailure
from storage import get_json
from storage.artifacts import download_tree
from tests.support.kube_emulator import Cluster, api, api_client_for, cluster
from tests.support.kube_node import (
    CANARY,
    CONFIG,
    NAMESPACE,
    RUNNING,
    VERSION_OUT,
    Node,
    container_status,
    finish,
    make_runtime,
    make_task,
    node,
    pull_failure,
    store,
    terminated,
)

__all__ = ["api", "cluster", "make_runtime", "node", "store"]  # fixtures


# --- scenarios ------------------------------------------------------------------------------


def test_a_job_waits_for_its_pod_until_a_container_starts(
    make_runtime: Any, node: Node, store: Any
) -> None:
    """``tasks_waiting`` (resource_function_tasks_waiting): a followed Job counts while it
    has no pod, or a pod none of whose containers has started (unscheduled, pulling)."""
    runtime = make_runtime()
    seen: list[int] = []

    def until(count: int) -> None:
        end = time.monotonic() + 10
        while runtime.tasks_waiting() != count and time.monotonic() < end:
            time.sleep(0.02)
        seen.append(runtime.tasks_waiting())

    def script(node: Node) -> None:
        job = node.wait_job()
        secret = node.wait_secret(job)
        pod = node.create_pod(job)
        node.pod_status(
            pod,
            "Pending",
            [container_status("stage", {"waiting": {"reason": "PodInitializing"}})],
            [container_status("collect", {"waiting": {"reason": "PodInitializing"}})],
            conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        )
        until(1)
        node.pod_status(pod, "Pending", [container_status("resource", RUNNING)])
        until(0)
        task_files = {"exit-code": b"0\n", "stdout": VERSION_OUT, "stderr": b""}
        assert node.run_step(job, "collect", secret, task_files, {"f": b"x"}) == 0
        node.succeed(pod, job)

    thread = node.play(script)
    outcome = runtime.run(make_task("get"))
    node.check(thread)
    assert outcome.succeeded, outcome
    assert seen == [1, 0] and runtime.tasks_waiting() == 0


def test_get_succeeds_and_its_artifact_is_in_the_store(
    make_runtime: Any, node: Node, cluster: Cluster, store: Any, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}
    task = make_task("get")
    thread = node.play(
        finish(output={"README": b"hello\n", "src/main.py": b"print(1)\n"}, seen=seen)
    )
    outcome = make_runtime().run(task)
    node.check(thread)
    assert outcome.succeeded, outcome
    assert outcome.data is not None
    assert outcome.data["version"] == {"ref": "abc123"}
    assert outcome.data["metadata"] == [{"name": "author", "value": "ci"}]
    artifact = outcome.data["artifact"]
    assert artifact["url"] == store.url_for(f"artifacts/{task.cache_key}.tar.zst")
    assert artifact["format"] == "tar+zstd" and artifact["digest"].startswith("sha256:")
    key = f"artifacts/{task.cache_key}.tar.zst"
    download_tree(store, key, tmp_path / "out", expected_digest=artifact["digest"])
    assert (tmp_path / "out/src/main.py").read_bytes() == b"print(1)\n"
    assert results.read_outcome(store, task.run_id, request=task.request_digest) == outcome
    kubernetes_validate.validate(seen["job"], "1.37", strict=True)
    # Coarser than the local runtime's: what happens inside the pod is one phase.
    assert [phase.name for phase in outcome.phases] == ["launch", "pod", "result"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_pods_own_phases_join_the_runs(
    make_runtime: Any,
    node: Node,
    termination: Path,
    sink: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """What collect reports in its termination message (``StepTimings``) joins the run's
    phases, synchronous or not: they reach the phase histogram and the run's log line."""
    script = finish(output={"f": b"x"}, files={"started": b""}, termination=termination)
    thread = node.play(script)
    if mode == "sync":
        outcome = make_runtime().run(make_task("get"))
    else:
        monkeypatch.setenv("K_SINK", sink.url)  # collect replies
        ended: list[Any] = []
        make_runtime(sink=sink.url).start(make_task("get"), ended=ended.append)
        outcome = wait_until(lambda: ended, "the end reported", 10)[0]
    node.check(thread)
    names = [phase.name for phase in outcome.phases]
    assert names[:2] == ["script", "collect_import"] and "upload" in names and "store" in names
    assert names[-3:] == ["launch", "pod", "result"]


def test_secret_is_owned_by_the_job_and_deleted_after_completion(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    seen: dict[str, Any] = {}
    task = make_task("check")
    thread = node.play(finish(stdout=b'[{"ref": "1"}]', seen=seen))
    outcome = make_runtime().run(task)
    node.check(thread)
    assert outcome.data == {"versions": [{"ref": "1"}]}
    job, secret = seen["job"], seen["secret"]
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
        }
    ]  # no blockOwnerDeletion
    assert base64.b64decode(secret["data"]["stdin"]) == task.stdin
    assert CANARY not in json.dumps(job)
    assert cluster.live("secrets", secret["metadata"]["name"]) is None
    assert cluster.live("jobs", job["metadata"]["name"]) is not None  # its TTL deletes it


def test_resource_failure_is_recorded_by_collect_with_secrets_redacted(
    make_runtime: Any, node: Node, store: Any
) -> None:
    task = make_task("get")
    thread = node.play(finish(exit_code=3, stdout=b"", stderr=f"auth failed: {CANARY}\n".encode()))
    outcome = make_runtime().run(task)
    node.check(thread)
    assert outcome.failure is not None
    assert (outcome.failure.kind, outcome.failure.exit_code) == ("resource_failed", 3)
    assert "auth failed: [redacted]" in (outcome.failure.log_tail or "")
    with store.open(keys.log_key(task.run_id)) as stream:
        assert stream.read() == b"auth failed: [redacted]\n"
    assert get_json(store, keys.result_key(task.run_id))["error"]["kind"] == "resource_failed"


def test_image_pull_failure_fails_fast_and_deletes_the_job(
    make_runtime: Any, node: Node, cluster: Cluster, store: Any
) -> None:
    task = make_task("get", timeout=600, image="nope:1")
    thread = node.play(pull_failure("ErrImagePull", "manifest unknown", image="nope:1"))
    started = time.monotonic()
    outcome = make_runtime().run(task)
    node.check(thread)
    assert time.monotonic() - started < 5
    assert outcome.failure is not None and outcome.failure.kind == "image_pull"
    assert "nope:1" in outcome.failure.message and "manifest unknown" in outcome.failure.message
    name = f"rf-get-{task.run_id[:20]}"
    assert cluster.live("jobs", name) is None
    deletes = cluster.requests("delete", "jobs")
    assert deletes and deletes[0].params.get("propagationPolicy") == "Background"
    assert (
        results.read_outcome(store, task.run_id, request=task.request_digest) == outcome
    )  # a redelivery replays it


def test_timeout_deletes_the_job(
    make_runtime: Any, node: Node, cluster: Cluster, store: Any
) -> None:
    def script(node: Node) -> None:
        pod = node.create_pod(node.wait_job())
        node.pod_status(pod, "Running", [container_status("resource", RUNNING)])

    task = make_task("check", timeout=1)
    thread = node.play(script)
    started = time.monotonic()
    outcome = make_runtime(margin_seconds=1).run(task)
    node.check(thread)
    assert 1.4 <= time.monotonic() - started < 8  # creationTimestamp has whole seconds
    assert outcome.failure is not None and outcome.failure.kind == "timeout"
    assert cluster.live("jobs", f"rf-check-{task.run_id[:20]}") is None
    assert results.read_outcome(store, task.run_id, request=task.request_digest) == outcome


def test_deadline_exceeded_job_is_a_timeout(make_runtime: Any, node: Node) -> None:
    def script(node: Node) -> None:
        job = node.wait_job()
        pod = node.create_pod(job)
        node.pod_status(pod, "Running", [container_status("resource", RUNNING)])
        node.job_condition(job, "Failed", "DeadlineExceeded")
        node.pod_status(pod, "Failed", [container_status("resource", terminated(143))])

    thread = node.play(script)
    outcome = make_runtime().run(make_task("check"))
    node.check(thread)
    assert outcome.failure is not None and outcome.failure.kind == "timeout"


def test_failed_step_is_a_runtime_failure_with_its_message(make_runtime: Any, node: Node) -> None:
    def script(node: Node) -> None:
        job = node.wait_job()
        pod = node.create_pod(job)
        node.pod_status(
            pod,
            "Failed",
            [container_status("resource", terminated())],
            [container_status("collect", terminated(1, REFUSED.termination_message()))],
        )
        node.job_condition(job, "Failed", "BackoffLimitExceeded")

    thread = node.play(script)
    outcome = make_runtime().run(make_task("check"))
    node.check(thread)
    assert outcome.failure is not None and outcome.failure.kind == "storage"  # the step's
    assert "'collect' exited with code 1" in outcome.failure.message
    assert "store down" in outcome.failure.message


REFUSED = StepFailure("storage", False, "collect: cannot record the outcome: store down")
OUTAGE = StepFailure("storage", True, "collect: the store is unavailable: timed out")


def collect_without_store(termination: Path) -> Callable[[Node], None]:
    """A node script: the resource step succeeds, then the REAL collect step cannot reach
    the store (STORE_URL points at nothing) and the pod fails the way kubelet reports it."""

    def script(node: Node) -> None:
        job = node.wait_job()
        secret = node.wait_secret(job)
        pod = node.create_pod(job)
        code = node.run_step(job, "collect", secret, {"exit-code": b"0\n", "stdout": b"[]"})
        reported = StepFailure.parse(termination.read_text())
        assert code == 1 and reported is not None and reported.retryable
        node.pod_status(
            pod,
            "Failed",
            [container_status("resource", terminated())],
            [container_status("collect", terminated(code, termination.read_text()))],
        )
        node.job_condition(job, "Failed", "BackoffLimitExceeded")

    return script


def test_a_store_outage_in_a_step_is_retried_not_recorded(
    make_runtime: Any,
    node: Node,
    cluster: Cluster,
    store: Any,
    termination: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STORE_URL", "file:///nonexistent-store-dir-for-test")  # collect's only
    task = make_task("check")
    name = f"rf-check-{task.run_id[:20]}"
    thread = node.play(collect_without_store(termination))
    with pytest.raises(Unavailable, match="may pass") as raised:
        make_runtime().run(task)
    node.check(thread)
    assert "collect: the store is unavailable" in str(raised.value)
    assert (
        results.read_outcome(store, task.run_id, request=task.request_digest) is None
    )  # nothing for a redelivery to replay
    assert cluster.live("jobs", name) is None and cluster.live("secrets", f"{name}-stdin") is None
    old_pods = [p for p in cluster.ever("pods") if p["metadata"]["labels"]["job-name"] == name]
    assert len(old_pods) == 1  # still there (no garbage collector here): not the new Job's
    # The redelivery (Knative retries the 503) starts a new Job, which succeeds.
    monkeypatch.setenv("STORE_URL", store.url)
    thread = node.play(finish(stdout=b'[{"ref": "1"}]'))
    outcome = make_runtime().run(task)
    node.check(thread)
    assert outcome.data == {"versions": [{"ref": "1"}]}
    assert len(cluster.requests("create", "jobs")) == 2


def test_a_store_outage_in_stage_is_retried(
    make_runtime: Any, node: Node, cluster: Cluster, store: Any
) -> None:
    def script(node: Node) -> None:
        job = node.wait_job()
        pod = node.create_pod(job)
        message = StepFailure("storage", True, "stage: the store is unavailable: refused")
        stage = terminated(1, message.termination_message())
        node.pod_status(pod, "Failed", [container_status("stage", stage)])
        node.job_condition(job, "Failed", "BackoffLimitExceeded")

    task = make_task("put")
    thread = node.play(script)
    with pytest.raises(Unavailable, match="step 'stage' exited with code 1"):
        make_runtime().run(task)
    node.check(thread)
    assert cluster.live("jobs", f"rf-put-{task.run_id[:20]}") is None
    assert results.read_outcome(store, task.run_id, request=task.request_digest) is None


def test_async_store_outage_is_replied_as_storage_and_not_recorded(
    make_runtime: Any,
    node: Node,
    cluster: Cluster,
    store: Any,
    sink: Any,
    termination: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("STORE_URL", "file:///nonexistent-store-dir-for-test")
    monkeypatch.setenv("K_SINK", sink.url)
    task = make_task("check")
    thread = node.play(collect_without_store(termination))
    with caplog.at_level(logging.ERROR, logger="functions.kubernetes"):
        make_runtime(sink=sink.url).start(task)
        node.check(thread)
        record = wait_until(
            lambda: [r for r in caplog.records if "store" in r.getMessage()], "the error", 10
        )[0]
    assert record.levelno == logging.ERROR
    assert getattr(record, "fields", {})["run_id"] == task.run_id
    assert cluster.live("jobs", f"rf-check-{task.run_id[:20]}") is None
    reply = sink.next(10)
    assert reply.get_type() == "dev.resourcefunctions.check.failed"
    assert reply.get_data()["error"]["kind"] == "storage"
    assert (
        results.read_outcome(store, task.run_id, request=task.request_digest) is None
    )  # sending it again runs afresh


def test_a_stale_secret_of_an_earlier_job_is_replaced(
    make_runtime: Any, node: Node, cluster: Cluster, api: Any
) -> None:
    """A Secret left by a deleted Job of the same name would be garbage-collected under
    the new pod: the runtime replaces it rather than attach to it."""
    task = make_task("check")
    name = f"rf-check-{task.run_id[:20]}-stdin"
    client.CoreV1Api(api).create_namespaced_secret(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "data": {"stdin": "c3RhbGU="},
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name[:-6], "uid": "old-uid"}
                ],
            },
        },
    )
    seen: dict[str, Any] = {}
    thread = node.play(finish(stdout=b"[]", seen=seen))
    outcome = make_runtime().run(task)
    node.check(thread)
    assert outcome.data == {"versions": []}
    assert base64.b64decode(seen["secret"]["data"]["stdin"]) == task.stdin
    assert len(cluster.requests("create", "secrets")) == 3  # the stale one, refused, again


def test_the_unavailable_verdict() -> None:
    def pod(name: str, code: int, message: str = "") -> dict[str, Any]:
        return {
            "status": {
                "phase": "Failed",
                "initContainerStatuses": [
                    container_status(name, terminated(code, message or None))
                ],
            }
        }

    failed_job = {
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
        }
    }
    marked = OUTAGE.termination_message()
    for job in (failed_job, {}, None):  # failed; pod failed first; deleted by another delivery
        verdict = judge(job, [pod("collect", 1, marked)], deadline_passed=False)
        assert verdict is not None and verdict.kind == "unavailable", job
        assert verdict.detail == OUTAGE.message and verdict.failure == "storage"
    # Only our steps may ask for a retry; a resource image's words are its own business.
    verdict = judge(failed_job, [pod("resource", 1, marked)], deadline_passed=False)
    assert verdict is not None and verdict.kind == "runtime" and verdict.detail == ""
    verdict = judge(
        failed_job, [pod("collect", 1, REFUSED.termination_message())], deadline_passed=False
    )
    assert verdict is not None and (verdict.kind, verdict.failure) == ("runtime", "storage")
    verdict = judge(None, [pod("collect", 1, "not a step's report")], deadline_passed=False)
    assert verdict is not None and verdict.kind == "gone"


def test_pods_of_an_earlier_job_of_the_same_name_do_not_count() -> None:
    pod = {
        "metadata": {
            "labels": {"job-name": "j", "controller-uid": "old"},
            "ownerReferences": [{"kind": "Job", "uid": "old"}],
        }
    }
    assert belongs(pod, "j") and belongs(pod, "j", "old")
    assert not belongs(pod, "j", "new") and not belongs(pod, "other")
    assert belongs({"metadata": {"labels": {"job-name": "j"}}}, "j", "new")  # unknown owner


def test_redelivery_attaches_to_the_running_job(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    task = make_task("get")
    runtime = make_runtime()
    outcomes: list[Any] = []
    runs = [threading.Thread(target=lambda: outcomes.append(runtime.run(task))) for _ in range(2)]
    thread = node.play(finish(output={"f": b"x"}, delay=0.5))
    for run in runs:
        run.start()
    for run in runs:
        run.join(30)
    node.check(thread)
    assert len(outcomes) == 2 and outcomes[0] == outcomes[1] and outcomes[0].succeeded
    assert len(cluster.ever("jobs")) == 1
    assert len(cluster.requests("create", "jobs")) == 2  # the second got 409 and attached


def test_another_request_with_the_same_run_id_never_attaches_to_its_job(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    first = dataclasses.replace(make_task("check"), request_digest="a" * 64)
    thread = node.play(finish(stdout=b"[]", delay=0.5))
    runtime = make_runtime()
    done: list[Any] = []
    running = threading.Thread(target=lambda: done.append(runtime.run(first)))
    running.start()
    while not cluster.ever("jobs"):
        time.sleep(0.05)

    other = dataclasses.replace(first, request_digest="b" * 64)  # same pair, other data
    with pytest.raises(RequestIdReused):
        make_runtime().run(other)
    with pytest.raises(RequestIdReused):
        make_runtime().start(other)

    running.join(30)
    node.check(thread)
    assert done and done[0].succeeded and len(cluster.ever("jobs")) == 1
    job = cluster.ever("jobs")[0]
    assert job["metadata"]["annotations"]["resource-functions.dev/request"] == "a" * 64


def test_a_stopped_run_gets_no_job_and_no_secret(
    make_runtime: Any, store: Any, cluster: Cluster
) -> None:
    """Marked stopped before it starts (a stop request came first): nothing is created,
    synchronous or not, and ``RunStopped`` (retryable: a redelivery is answered as stopped)."""
    task = make_task("get")
    tombstones.record(store, task.run_id)
    runtime = make_runtime()
    with pytest.raises(RunStopped):
        runtime.run(task)
    with pytest.raises(RunStopped):
        runtime.start(task)
    assert cluster.ever("jobs") == [] and cluster.requests("create", "secrets") == []


def test_a_stop_that_crosses_the_start_deletes_the_job_before_its_secret(
    make_runtime: Any, store: Any, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark is read before the Job is created and once more after: a stop written in
    between (whose own deletion found no Job yet) still finds the Job, before the Secret its
    pod needs exists."""
    task = make_task("get")
    runtime = make_runtime()
    reads: list[bool] = []
    real = tombstones.stopped

    def stop_lands_after_the_first_read(store_: Any, run: str) -> bool:
        found = real(store_, run)
        if not reads:
            tombstones.record(store_, run)
            runtime.stop(run, "get")  # as the stop request's replica does: no Job yet
        reads.append(found)
        return found

    monkeypatch.setattr(tombstones, "stopped", stop_lands_after_the_first_read)
    with pytest.raises(RunStopped):
        runtime.run(task)
    assert reads == [False, True]
    assert (
        len(cluster.ever("jobs")) == 1
        and cluster.live("jobs", f"rf-get-{task.run_id[:20]}") is None
    )
    assert cluster.requests("create", "secrets") == []


def test_stop_deletes_a_running_jobs_job_and_secret(
    make_runtime: Any, cluster: Cluster, sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K_SINK", sink.url)
    task = make_task("check")
    runtime = make_runtime(sink=sink.url)
    runtime.start(task)
    name = f"rf-check-{task.run_id[:20]}"
    assert cluster.live("jobs", name) is not None
    runtime.stop(task.run_id, "check")
    assert cluster.live("jobs", name) is None
    assert cluster.live("secrets", f"{name}-stdin") is None


def test_redelivery_after_completion_creates_no_new_secret(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    task = make_task("check")
    thread = node.play(finish(stdout=b"[]"))
    first = make_runtime().run(task)
    node.check(thread)
    secrets_before = len(cluster.requests("create", "secrets"))
    assert make_runtime().run(task) == first
    assert len(cluster.requests("create", "secrets")) == secrets_before


def test_watch_expiry_and_410_gone_make_the_runtime_list_again(
    make_runtime: Any, node: Node, cluster: Cluster
) -> None:
    cluster.emulator.gone_watches = 1

    def relisted() -> bool:  # first, after the 410, after an expiry (the pod waits)
        return len(cluster.requests("watch", "pods")) >= 3  # each watch after its list

    thread = node.play(finish(stdout=b"[]", until=relisted))
    outcome = make_runtime(watch_seconds=0.5).run(make_task("check"))
    node.check(thread)
    assert outcome.data == {"versions": []}
    assert len(cluster.requests("list", "pods")) >= 3
    assert len(cluster.requests("watch", "pods")) >= 3


def test_unreachable_api_is_unavailable(store: Any, unused_port: int) -> None:
    api_client = api_client_for(f"http://127.0.0.1:{unused_port}")
    runtime = KubernetesRuntime(api_client, store, CONFIG)
    started = time.monotonic()
    with pytest.raises(Unavailable, match="unreachable"):
        runtime.run(make_task("check"))
    assert time.monotonic() - started < 10
    runtime.close()


def test_ready_when_the_api_lists_a_job_and_not_when_unreachable(
    make_runtime: Any, cluster: Cluster, store: Any, unused_port: int
) -> None:
    make_runtime().ready()
    assert cluster.requests("list", "jobs")
    unreachable = KubernetesRuntime(
        api_client_for(f"http://127.0.0.1:{unused_port}"), store, CONFIG
    )
    with pytest.raises(Unavailable, match="unreachable"):
        unreachable.ready()
    unreachable.close()


def test_forbidden_names_the_missing_verb(make_runtime: Any, cluster: Cluster) -> None:
    (
        cluster.emulator["post", "/apis/batch/v1/namespaces/tasks/jobs"]
        << 403
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "code": 403,
            "reason": "Forbidden",
            "message": 'jobs.batch is forbidden: User "system:serviceaccount:rf:rf" cannot create',
        }
    )
    with pytest.raises(Unavailable, match=r"refused 'create jobs' in namespace 'tasks'.*rbac"):
        make_runtime().run(make_task("check"))


def test_an_invalid_secret_is_a_recorded_failure_and_its_job_is_deleted(
    make_runtime: Any, cluster: Cluster, store: Any
) -> None:
    (
        cluster.emulator["post", "/api/v1/namespaces/tasks/secrets"]
        << 422
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "code": 422,
            "reason": "Invalid",
            "message": "Secret is invalid: data: Too long: must have at most 1048576 bytes",
        }
    )
    task = make_task("check")
    outcome = make_runtime().run(task)
    assert outcome.failure is not None and outcome.failure.kind == "runtime"
    assert "Too long" in outcome.failure.message
    assert cluster.live("jobs", f"rf-check-{task.run_id[:20]}") is None
    assert results.read_outcome(store, task.run_id, request=task.request_digest) == outcome


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (500, Unavailable),
        (503, Unavailable),
        (429, Unavailable),
        (401, Unavailable),
        (400, Rejected),
        (422, Rejected),
    ],
)
def test_api_errors_are_classified(status: int, expected: type) -> None:
    err = client.ApiException(status=status, reason="x")
    err.body = json.dumps({"message": "the message"})
    assert isinstance(translate(err, "create", "jobs", "ns"), expected)


# --- asynchronous completion ----------------------------------------------------------------


def test_async_start_returns_at_once_and_collect_replies(
    make_runtime: Any, node: Node, cluster: Cluster, sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K_SINK", sink.url)  # what the SinkBinding injects into the task pod
    task = make_task("check")
    runtime = make_runtime(sink=sink.url)
    started = time.monotonic()
    runtime.start(task)
    # Nothing ends the Job before the node plays below: a start that waited for the run
    # would take the task's 600 s. Far below that, and far above what a busy machine takes.
    assert time.monotonic() - started < 30
    job = cluster.live("jobs", f"rf-check-{task.run_id[:20]}")
    assert job is not None
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    reply = CollectStep.parse(command[4:]).reply
    assert reply is not None and reply.request_id == task.request_id
    runtime.start(task)  # a redelivery: already started
    assert len(cluster.ever("jobs")) == 1
    thread = node.play(finish(stdout=b'[{"ref": "2"}]'))
    node.check(thread)
    reply = sink.next(10)
    assert reply.get_type() == "dev.resourcefunctions.check.succeeded"
    assert reply.get_extension("requestid") == task.request_id
    assert reply.get_data() == {"versions": [{"ref": "2"}]}
    time.sleep(1.5)  # the follower sees the Job complete and must not reply again
    assert len(sink.events) == 1


def test_async_image_pull_failure_is_replied_by_the_function(
    make_runtime: Any, node: Node, sink: Any
) -> None:
    thread = node.play(pull_failure("ImagePullBackOff", "back-off"))
    make_runtime(sink=sink.url).start(make_task("get"))
    node.check(thread)
    reply = sink.next(10)
    assert reply.get_type() == "dev.resourcefunctions.get.failed"
    assert reply.get_data()["error"]["kind"] == "image_pull"


def test_async_timeout_enforced_in_the_pod_is_replied_by_collect(
    make_runtime: Any, node: Node, sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K_SINK", sink.url)
    task = make_task("get", timeout=30)
    # What RESOURCE_SCRIPT leaves when its watchdog stopped the script (test_pod_spec).
    thread = node.play(
        finish(exit_code=124, stdout=b"", stderr=b"cloning...\n", files={"timed-out": b"30\n"})
    )
    make_runtime(sink=sink.url).start(task)
    node.check(thread)
    reply = sink.next(10)
    assert reply.get_type() == "dev.resourcefunctions.get.failed"
    error = reply.get_data()["error"]
    assert error == {
        "kind": "timeout",
        "message": "the resource script ran longer than 30s",
        "log_tail": "cloning...\n",
    }
    time.sleep(1.5)  # the follower sees the Job complete and must not reply again
    assert len(sink.events) == 1


def holding_a_lease(store: Any, task: Task) -> Task:
    """The task with a check lease taken for its run, as the service starts an async check."""
    key = f"leases/{uuid.uuid4().hex}.json"
    claim = lease.take(store, key, None, run=task.run_id, ttl=600, now=time.time())
    assert claim is not None
    return replace(task, lease=LeaseHold(key, claim.lease.holder))


def released(store: Any, task: Task) -> bool:
    assert task.lease is not None
    seen = lease.read(store, task.lease.key)
    return seen is not None and seen.lease.holder == task.lease.holder and seen.lease.released


def test_an_async_checks_collect_releases_its_lease_once_it_has_recorded(
    make_runtime: Any, node: Node, store: Any, sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K_SINK", sink.url)
    task = holding_a_lease(store, make_task("check"))
    at_collects_end: list[bool] = []
    script = finish(
        stdout=b'[{"ref": "2"}]',
        after_collect=lambda: at_collects_end.append(released(store, task)),
    )
    thread = node.play(script)
    make_runtime(sink=sink.url).start(task)
    node.check(thread)

    assert sink.next(10).get_data() == {"versions": [{"ref": "2"}]}
    assert at_collects_end == [True]  # by collect: the function saw no end of the pod yet


def test_an_async_checks_lease_is_released_by_the_function_when_collect_never_ran(
    make_runtime: Any, node: Node, store: Any, sink: Any
) -> None:
    task = holding_a_lease(store, make_task("check"))
    thread = node.play(pull_failure("ImagePullBackOff", "back-off"))
    make_runtime(sink=sink.url).start(task)
    node.check(thread)

    assert sink.next(10).get_data()["error"]["kind"] == "image_pull"
    assert released(store, task)  # before the reply: a waiter need not wait for the expiry
    assert results.read_outcome(store, task.run_id, request=task.request_digest) is not None


# --- configuration --------------------------------------------------------------------------


def test_from_settings_uses_kubeconfig(cluster: Cluster, store: Any, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": cluster.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
            }
        )
    )
    settings = Settings.from_env(
        {
            "KUBECONFIG": str(kubeconfig),
            "TASK_NAMESPACE": NAMESPACE,
            "RUNTIME": "kubernetes",
            "TASK_STORE_SECRET": "store-creds",
            "ARCHIVE_LEVEL": "7",
            "TASK_NODE_SELECTOR": '{"pool": "ci"}',
            "TASK_IMAGE_PULL_SECRETS": "pull-a,pull-b",
        }
    )
    runtime = KubernetesRuntime.from_settings(settings, store)
    try:
        task = make_task("check")
        runtime._closed.set()  # no background follower
        runtime.start(task)
        job = cluster.live("jobs", f"rf-check-{task.run_id[:20]}")
    finally:
        runtime.close()
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "ci"}
    assert pod["imagePullSecrets"] == [{"name": "pull-a"}, {"name": "pull-b"}]
    collect = pod["containers"][0]
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    assert volumes["store-credentials"] == "store-creds" and "envFrom" not in collect
    assert {"name": "ARCHIVE_LEVEL", "value": "7"} in collect["env"]
