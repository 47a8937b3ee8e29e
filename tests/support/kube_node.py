"""The kubernetes runtime's test bench: kmock's stateful KubernetesEmulator over HTTP, a real
S3 store (versitygw), the runtime on both, and a test thread that plays the node (kubelet and
Job controller): it waits for the Job, creates its pod, advances the pod's status and runs the
REAL collect step (the Job's own collect command, through the CLI). kmock stores what it is sent
without validation and ignores label selectors and watch timeouts; the Job it stores is checked
against the schema. Used by ``tests/servers/test_kubernetes_runtime.py`` and
``test_pod_watch.py``, which import its fixtures."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from functions import cli, protocol
from functions.model import Build, ResourceType, Task
from functions.redaction import secret_values
from functions.runtimes.kube.job_plan import KubernetesConfig
from functions.runtimes.kube.kubernetes import KubernetesRuntime
from functions.steps.pod_contract import CollectStep, StageStep
from storage import StoreOptions, open_store
from tests.support.kube_emulator import api, cluster
from tests.support.runs import run_of

__all__ = ["api", "cluster", "make_runtime", "node", "store"]  # fixtures

NAMESPACE = "tasks"
CANARY = "canary-7d3f9b2e-do-not-leak"
IMAGE = "registry.example.com/git-resource:1"
VERSION_OUT = b'{"version": {"ref": "abc123"}, "metadata": [{"name": "author", "value": "ci"}]}'


# --- the store, the runtime and the node ----------------------------------------------------


@pytest.fixture
def store(s3_env: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    store = open_store(f"s3://{s3_bucket}/k8s-{uuid.uuid4().hex[:12]}", StoreOptions())
    monkeypatch.setenv("STORE_URL", store.url)  # the collect step's env, as in the pod
    return store


CONFIG = KubernetesConfig(
    namespace=NAMESPACE,
    service_account="resource-task",
    task_image="resource-functions:test",
    margin_seconds=60,
    watch_seconds=1.0,
    deadline_slack_seconds=0.5,
    result_wait_seconds=2.0,
)


@pytest.fixture
def make_runtime(api: Any, store: Any) -> Iterator[Callable[..., KubernetesRuntime]]:
    made: list[KubernetesRuntime] = []

    def make(**overrides: Any) -> KubernetesRuntime:
        runtime = KubernetesRuntime(api, store, replace(CONFIG, **overrides))
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime._closed.set()  # background followers stop; the fixture closes the client
        runtime._pods.close()  # and so does the pod watch


def make_task(
    action: str = "get", *, timeout: float = 600, request_id: str | None = None, image: str = IMAGE
) -> Task:
    request_id = request_id or str(uuid.uuid4())
    source = {"uri": "https://git.example.com/r.git", "private_key": CANARY}
    version = {"ref": "abc123"} if action != "put" else None
    return Task(
        run_id=run_of(b"test", "//ci.example.com", request_id, action),
        action=action,  # type: ignore[arg-type]
        resource_type=ResourceType(image=image),
        stdin=protocol.stdin_payload(action, source, version, {}),  # type: ignore[arg-type]
        env=protocol.build_env(action, Build(id="1")),  # type: ignore[arg-type]
        inputs={},
        cache_key=uuid.uuid4().hex * 2 if action == "get" else None,
        timeout_seconds=timeout,
        request_id=request_id,
        request_source="//ci.example.com",
        subject="pipelines/main",
        secrets=secret_values(source=source, params={}),  # as the service computes them
    )


def container_status(name: str, state: dict[str, Any], image: str = IMAGE) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": state,
    }


RUNNING = {"running": {"startedAt": "2024-01-01T00:00:00Z"}}


def terminated(code: int = 0, message: str | None = None) -> dict[str, Any]:
    ended: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    return {"terminated": {**ended, **({"message": message} if message else {})}}


@dataclass
class Node:
    """Kubelet and Job controller for the Jobs of one test, driven by a script in a thread."""

    api_client: Any
    workdir: Path
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)

    def play(self, script: Callable[[Node], None]) -> threading.Thread:
        def run() -> None:
            try:
                script(self)
            except Exception as err:  # noqa: BLE001 - reported by check()
                self.errors.append(err)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def check(self, thread: threading.Thread) -> None:
        thread.join(30)
        assert not thread.is_alive(), "the node script did not finish"
        if self.errors:
            raise self.errors[0]

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
        """Until ``condition()`` holds. Past ``timeout`` the script goes on, so that the runs
        it serves end, and ``check`` reports that ``what`` did not happen."""
        end = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > end:
                self.errors.append(AssertionError(f"{what} did not happen"))
                return
            time.sleep(0.05)

    def wait_job(self, timeout: float = 10) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            items = (
                json.loads(
                    self.batch.list_namespaced_job(NAMESPACE, _preload_content=False).data
                ).get("items")
                or []
            )
            if items:
                return items[0]
            time.sleep(0.05)
        raise AssertionError("no Job was created")

    def wait_secret(self, job: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        """The Job's stdin Secret (owned by this Job: not a stale one of the same name)."""
        end = time.monotonic() + timeout
        name = job["metadata"]["name"] + "-stdin"
        while time.monotonic() < end:
            try:
                secret = json.loads(
                    self.core.read_namespaced_secret(name, NAMESPACE, _preload_content=False).data
                )
                owners = secret["metadata"].get("ownerReferences") or []
                if any(o["uid"] == job["metadata"]["uid"] for o in owners):
                    return dict(secret)
            except client.ApiException:
                pass
            time.sleep(0.05)
        raise AssertionError(f"Secret {name} was not created")

    def create_pod(self, job: dict[str, Any]) -> str:
        """The Job's pod, labelled and owned as the Job controller does it."""
        job_name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        name = job_name + "-" + uuid.uuid4().hex[:5]
        template = job["spec"]["template"]
        labels = {
            **template["metadata"]["labels"],
            "job-name": job_name,
            "batch.kubernetes.io/job-name": job_name,
            "controller-uid": uid,
            "batch.kubernetes.io/controller-uid": uid,
        }
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        self.core.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "spec": template["spec"],
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "status": {"phase": "Pending"},
            },
        )
        return name

    def pod_status(
        self,
        pod: str,
        phase: str,
        init: list[dict[str, Any]],
        main: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> None:
        status = {
            "phase": phase,
            "initContainerStatuses": init,
            "containerStatuses": main
            or [container_status("collect", {"waiting": {"reason": "PodInitializing"}})],
            **extra,
        }
        self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": status})

    def succeed(self, pod: str, job: dict[str, Any], collect_message: str | None = None) -> None:
        """The pod ends well (both steps terminated 0) and its Job is Complete."""
        self.pod_status(
            pod,
            "Succeeded",
            [container_status("resource", terminated())],
            [container_status("collect", terminated(0, collect_message))],
        )
        self.job_condition(job, "Complete")

    def job_condition(self, job: dict[str, Any], kind: str, reason: str = "") -> None:
        """As the Job controller marks the Job; none if the runtime has deleted it already
        (it may, once the pod's status has decided, before the Job controller writes)."""
        condition = {"type": kind, "status": "True", "reason": reason, "message": reason}
        try:
            self.batch.patch_namespaced_job_status(
                job["metadata"]["name"], NAMESPACE, {"status": {"conditions": [condition]}}
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def run_step(
        self,
        job: dict[str, Any],
        step: str,
        secret: dict[str, Any] | None = None,
        task_files: dict[str, bytes] | None = None,
        output: dict[str, bytes] | None = None,
    ) -> int:
        """Run a step container's command in this process, as the pod would."""
        build = self.workdir / job["metadata"]["name"] / "build"
        for name, body in {**(task_files or {})}.items():
            (build / ".task").mkdir(parents=True, exist_ok=True)
            (build / ".task" / name).write_bytes(body)
        for name, body in (output or {}).items():
            (build / "get" / name).parent.mkdir(parents=True, exist_ok=True)
            (build / "get" / name).write_bytes(body)
        stdin = build.parent / "stdin"
        if secret is not None:  # each key of the Secret is a file of its volume
            for key, value in secret["data"].items():
                stdin.with_name(key).write_bytes(base64.b64decode(value))
        command = next(
            c
            for c in job["spec"]["template"]["spec"]["containers"]
            + job["spec"]["template"]["spec"].get("initContainers", [])
            if c["name"] == step
        )["command"]
        assert command[:3] == ["python", "-m", "functions"]
        # The step's own arguments, with the pod's paths moved to this node's directory.
        if command[3] == "collect":
            collect = CollectStep.parse(command[4:])
            moved = replace(collect, build_dir=str(build), stdin_file=str(stdin)).argv()
        else:
            stage = StageStep.parse(command[4:])
            moved = replace(
                stage, directory=str(build / "put"), task_dir=str(build / ".task")
            ).argv()
        return cli.main(moved)


@pytest.fixture
def node(api: Any, tmp_path: Path) -> Node:
    return Node(api, tmp_path)


def finish(
    *,
    exit_code: int = 0,
    stdout: bytes = VERSION_OUT,
    stderr: bytes = b"fetched\n",
    output: dict[str, bytes] | None = None,
    seen: dict[str, Any] | None = None,
    delay: float = 0.0,
    until: Callable[[], bool] | None = None,
    files: dict[str, bytes] | None = None,
    after_collect: Callable[[], None] = lambda: None,
    termination: Path | None = None,
) -> Callable[[Node], None]:
    """A node script: the pod runs, the resource step ends with ``exit_code``, collect runs
    for real and the Job completes. ``seen`` receives the Job and Secret as created; the
    pod comes after ``delay``, and once ``until()`` holds if given; ``files`` are more files
    the resource step left in .task/; ``after_collect`` runs once collect has exited, before
    the pod's end shows; ``termination``: collect's termination message file, shown in its
    container status as the kubelet does."""

    def script(node: Node) -> None:
        job = node.wait_job()
        secret = node.wait_secret(job)
        if seen is not None:
            seen.update(job=job, secret=secret)
        time.sleep(delay)
        if until is not None:
            node.wait_until(until, "what the pod waited for")
        pod = node.create_pod(job)
        node.pod_status(pod, "Pending", [container_status("resource", RUNNING)])
        node.pod_status(
            pod,
            "Running",
            [container_status("resource", terminated())],
            [container_status("collect", RUNNING)],
        )
        task_files = {  # in the order the resource step writes them
            **(files or {}),
            "stdout": stdout,
            "stderr": stderr,
            "exit-code": f"{exit_code}\n".encode(),
        }
        assert node.run_step(job, "collect", secret, task_files, output) == 0
        after_collect()
        message = termination.read_text() if termination else None
        node.succeed(pod, job, message)

    return script


def pull_failure(reason: str, message: str, image: str = IMAGE) -> Callable[[Node], None]:
    """A node script: the pod's resource image cannot be pulled (``reason``, ``message``)."""

    def script(node: Node) -> None:
        pod = node.create_pod(node.wait_job())
        waiting = {"waiting": {"reason": reason, "message": message}}
        node.pod_status(pod, "Pending", [container_status("resource", waiting, image=image)])

    return script
