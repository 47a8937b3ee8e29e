"""The task pod's steps for real: the Job's pod spec (``podspec.job_manifest``) run container
by container under Podman (``tests/support/podman_pod.py``), with the project image (Dockerfile) for
stage/collect, the test resource image for the resource step, and a real S3 server as store.

The emptyDir is a host directory prepared as the kubelet prepares it (2777, group fsGroup);
stage and collect run as 65532 on a read-only root, as their securityContext says. Podman is
required: without it these tests fail.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from functions import keys
from functions.model import Action, ArtifactRef, Build, ResourceType, Task
from functions.protocol import build_env, stdin_payload
from functions.redaction import secret_values
from functions.runtimes.kube.job_plan import KubernetesConfig, plan_for
from functions.runtimes.kube.podspec import (
    BUILD_VOLUME,
    STEP_UID,
    job_manifest,
    stdin_secret_manifest,
)
from functions.steps.pod_contract import STEP_ENV, StepFailure
from storage import Store, StoreOptions, get_json, open_store
from storage.artifacts import download_tree, upload_tree
from tests.support.endpoints import Server
from tests.support.images import build_test_resource
from tests.support.podman_pod import StepResult, run_pod, secret_data, volume_path
from tests.support.project_image import build_project_image

pytestmark = [pytest.mark.server, pytest.mark.timeout(1800)]  # a cold image build: minutes

CANARY = "canary-7d3f9b2e-do-not-leak"
BUILD = Build(id="42", name="7", job="unit", pipeline="pipeline", team="main")
STORE_SECRET = "rf-store"
CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_EC2_METADATA_DISABLED",
)


@pytest.fixture(scope="session")
def podman() -> str:
    path = shutil.which("podman")
    if path is None:
        pytest.fail("podman is not installed (run .ci/setup)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def project_image(podman: str) -> str:
    return build_project_image()


@pytest.fixture(scope="session")
def resource_image(podman: str) -> str:
    return build_test_resource()


@dataclass(frozen=True)
class PodRun:
    """One task pod's run: its steps and the host directory that was its emptyDir."""

    run_id: str
    steps: list[StepResult]
    build: Path

    @property
    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    def assert_all_succeeded(self) -> None:
        for step in self.steps:
            assert step.returncode == 0, f"{step.name} exited {step.returncode}:\n{step.stderr}"


@dataclass(frozen=True)
class TaskPods:
    """Runs tasks the way the kubernetes runtime would, with the pod's containers on Podman."""

    project_image: str
    resource_image: str
    store: Store
    environ: Mapping[str, str]  # the function's environment (s3_env applied): the store
    root: Path

    def run(
        self,
        action: Action,
        source: dict[str, Any],
        *,
        version: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        cache_key: str | None = None,
        inputs: dict[str, ArtifactRef] | None = None,
    ) -> PodRun:
        task = Task(
            run_id=uuid.uuid4().hex,
            action=action,
            resource_type=ResourceType(image=self.resource_image),
            stdin=stdin_payload(action, source, version, params or {}),
            env=build_env(action, BUILD),
            inputs=inputs or {},
            cache_key=cache_key,
            timeout_seconds=60,
            # what the function hands collect: the values to redact (its policy applied)
            secrets=secret_values(source=source, params=params or {}),
        )
        plan = plan_for(task, self.config(), self.store.url, reply=False)
        spec = job_manifest(plan)["spec"]["template"]["spec"]
        stdin_secret = stdin_secret_manifest(
            plan, task.stdin, owner_uid=str(uuid.uuid4()), secrets=task.secrets
        )
        secrets = {
            plan.secret_name: secret_data(stdin_secret),
            STORE_SECRET: {k: v.encode() for k, v in self.environ.items() if k in CREDENTIALS},
        }
        root = self.root / task.run_id
        steps = run_pod(spec, root, secrets)
        return PodRun(task.run_id, steps, volume_path(root, BUILD_VOLUME))

    def config(self) -> KubernetesConfig:
        step_env = tuple((k, self.environ[k]) for k in STEP_ENV if self.environ.get(k))
        return KubernetesConfig(
            namespace="tasks",
            service_account="resource-task",
            task_image=self.project_image,
            store_secret=STORE_SECRET,
            step_env=step_env,
        )

    def result(self, run: PodRun) -> dict[str, Any]:
        return get_json(self.store, keys.result_key(run.run_id))

    def log(self, run: PodRun) -> str:
        with self.store.open(keys.log_key(run.run_id)) as stream:
            return stream.read().decode()


@pytest.fixture
def pods(
    project_image: str, resource_image: str, s3_env: Server, s3_bucket: str, tmp_path: Path
) -> TaskPods:
    store = open_store(f"s3://{s3_bucket}/pods-{uuid.uuid4().hex[:12]}", StoreOptions())
    return TaskPods(project_image, resource_image, store, dict(os.environ), tmp_path)


def new_cache_key(source: dict[str, Any], version: dict[str, str]) -> str:
    return keys.cache_key(
        b"test-secret", image="test-resource", source=source, version=version, params={}
    )


def assert_redacted(text: str) -> None:
    assert CANARY not in text
    assert "[redacted]" in text


def test_the_project_image_runs_the_cli_as_65532(project_image: str, podman: str) -> None:
    config = subprocess.run(
        [
            podman,
            "image",
            "inspect",
            "--format",
            "{{.Config.User}} {{json .Config.Entrypoint}}",
            project_image,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split(" ", 1)
    assert config[0] == f"{STEP_UID}:{STEP_UID}"
    assert json.loads(config[1]) == ["python", "-m", "functions"]


def test_get_stores_artifact_cache_record_log_and_result(pods: TaskPods, tmp_path: Path) -> None:
    source, version = {"password": CANARY}, {"ref": "7"}
    cache_key = new_cache_key(source, version)
    run = pods.run("get", source, version=version, cache_key=cache_key)

    assert run.names == ["resource", "collect"]  # a get has nothing to stage
    run.assert_all_succeeded()
    data = pods.result(run)["data"]
    assert data["version"] == {"ref": "7"} and data["cached"] is False
    assert data["metadata"] == [{"name": "build", "value": "42"}]
    artifact = data["artifact"]
    key = keys.artifact_key(cache_key, ".tar.zst")
    assert artifact["url"] == pods.store.url_for(key) and artifact["format"] == "tar+zstd"
    assert artifact["digest"] == pods.store.stat(key).digest  # type: ignore[union-attr]
    record = get_json(pods.store, keys.cache_record_key(cache_key))
    assert record == {"version": {"ref": "7"}, "metadata": data["metadata"], "artifact": artifact}
    log = pods.log(run)
    assert "fetched version 7" in log
    assert_redacted(log)

    out = tmp_path / "unpacked"
    download_tree(pods.store, key, out, expected_digest=artifact["digest"])
    assert (out / "version").read_text() == "7\n"
    assert (out / "sub/build.txt").read_text() == "build 42 of pipeline/unit\n"
    assert (out / "sub/run.sh").stat().st_mode & stat.S_IXUSR
    assert os.readlink(out / "sub/version-link") == "../version"
    assert (out / "sub/empty-dir").is_dir()


def test_check_records_the_versions(pods: TaskPods) -> None:
    run = pods.run("check", {"password": CANARY, "count": 2})
    assert run.names == ["resource", "collect"]
    run.assert_all_succeeded()
    recorded = pods.result(run)
    assert isinstance(recorded.pop("finished_at"), float)  # the run index's duration
    assert recorded == {
        "action": "check",
        "data": {"versions": [{"ref": "1"}, {"ref": "2"}]},
    }
    assert_redacted(pods.log(run))


def test_put_gives_its_staged_input_to_a_root_resource_and_records_the_version(
    pods: TaskPods, tmp_path: Path
) -> None:
    source = tmp_path / "repo"
    (source / "a").mkdir(parents=True)
    (source / "version").write_text("v1")
    (source / "a/b.txt").write_text("content")
    key = f"artifacts/{uuid.uuid4().hex}.tar.zst"
    info = upload_tree(pods.store, key, source)
    run = pods.run(
        "put",
        {"password": CANARY},
        params={"input": "repo"},
        inputs={"repo": ArtifactRef(key, info.digest)},
    )

    assert run.names == ["stage", "resource", "collect"]
    run.assert_all_succeeded()
    data = pods.result(run)["data"]
    assert data["version"] == {"ref": "pushed-v1"}
    assert data["metadata"] == [{"name": "files", "value": "./a/b.txt ./version "}]
    assert "artifact" not in data
    # Unpacked by stage (65532: test_the_project_image_runs_the_cli_as_65532), then given to
    # the resource step, which runs as root (Concourse's git resource needs it so: git refuses
    # a repository that another user owns).
    staged = run.build / "put/repo"
    assert [(p.stat().st_uid, p.stat().st_gid) for p in (staged, staged / "version")] == [
        (0, 0),
        (0, 0),
    ]
    assert "pushed from repo" in pods.log(run)


def test_a_failing_resource_is_a_recorded_result(pods: TaskPods) -> None:
    source, version = {"password": CANARY, "mode": "fail"}, {"ref": "1"}
    cache_key = new_cache_key(source, version)
    run = pods.run("get", source, version=version, cache_key=cache_key)

    run.assert_all_succeeded()  # resource and collect both exit 0: the failure is data
    assert (run.build / ".task/exit-code").read_text().strip() == "3"
    error = pods.result(run)["error"]
    assert error["kind"] == "resource_failed" and error["exit_code"] == 3
    assert "cannot reach the repository" in error["log_tail"]
    assert_redacted(error["log_tail"])
    assert_redacted(pods.log(run))
    assert pods.store.stat(keys.cache_record_key(cache_key)) is None
    assert pods.store.stat(keys.artifact_key(cache_key, ".tar.zst")) is None


def test_a_missing_input_is_a_storage_failure_and_the_script_does_not_run(pods: TaskPods) -> None:
    key = f"artifacts/missing-{uuid.uuid4().hex}.tar.zst"
    run = pods.run(
        "put", {"password": CANARY}, params={"input": "repo"}, inputs={"repo": ArtifactRef(key)}
    )

    assert run.names == ["stage", "resource", "collect"]
    run.assert_all_succeeded()
    assert key in (run.build / ".task/stage-error").read_text()
    assert not (run.build / ".task/exit-code").exists()
    assert not (run.build / ".task/stdout").exists()
    error = pods.result(run)["error"]
    assert error["kind"] == "storage" and key in error["message"]
    assert key in pods.log(run)


def test_an_unreachable_store_fails_the_stage_step_and_stops_the_pod(
    pods: TaskPods, unused_port: int
) -> None:
    environ = {**pods.environ, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{unused_port}"}
    broken = TaskPods(pods.project_image, pods.resource_image, pods.store, environ, pods.root)
    run = broken.run(
        "put", {}, params={"input": "repo"}, inputs={"repo": ArtifactRef("artifacts/x.tar.zst")}
    )

    assert run.names == ["stage"]  # a failed init container: the pod stops
    assert run.steps[0].returncode == 1
    reported = StepFailure.parse(run.steps[0].termination_message)
    assert reported is not None, run.steps[0].termination_message
    assert reported.retryable  # the function answers 503 and Knative redelivers: not a failure
    assert reported.message.startswith("stage: the store is unavailable"), reported
    assert not (run.build / ".task/stage-error").exists()


@pytest.mark.parametrize(
    ("action", "target", "kind", "expected"),
    [
        ("check", "stderr", "link", ("runtime", "stderr is a symbolic link")),
        ("check", "exit-code", "link", ("runtime", "exit-code is a symbolic link")),
        ("check", "stdout", "fifo", ("runtime", "stdout is a FIFO")),
        ("check", ".task", "link", ("runtime", ".task is a symbolic link")),
        ("get", "get", "link", ("invalid_output", "output directory is a symbolic link")),
        ("check", "stderr", "sparse", None),  # only its tail is read: a bounded log
    ],
    ids=["stderr-link", "exit-code-link", "stdout-fifo", "task-dir-link", "get-dir-link", "sparse"],
)
def test_what_a_hostile_resource_leaves_is_read_as_data_and_no_credential_leaks(
    pods: TaskPods, action: Action, target: str, kind: str, expected: tuple[str, str] | None
) -> None:
    """The resource image turns what collect reads into a link to /proc/self/environ (or
    /proc/self), a FIFO or a 10 GiB sparse file: collect ends cleanly and the store's
    credentials (mounted as files into collect alone) are nowhere."""
    source = {"password": CANARY, "mode": "hostile", "target": target, "as": kind}
    version = {"ref": "1"} if action == "get" else None
    cache_key = new_cache_key(source, version) if version else None
    run = pods.run(action, source, version=version, cache_key=cache_key)

    run.assert_all_succeeded()
    result = pods.result(run)
    if expected is None:
        assert "data" in result, result
        assert len(pods.log(run)) <= 5 * 1024 * 1024
    else:
        kind_, message = expected
        assert (result["error"]["kind"], message in result["error"]["message"]) == (kind_, True)
    credential = pods.environ["AWS_SECRET_ACCESS_KEY"]
    seen = [json.dumps(result), *(step.stdout + step.stderr for step in run.steps)]
    seen += [pods.log(run)] if pods.store.stat(keys.log_key(run.run_id)) else []
    assert not [text for text in seen if credential in text]
    for key in pods.store.list(""):
        with pods.store.open(key) as stream:
            assert credential.encode() not in stream.read(), key
