"""One task of each action and its Job plan under a full KubernetesConfig: the data the pod
spec tests and the manifest tests check."""

from __future__ import annotations

from typing import Any

from functions import protocol
from functions.model import ArtifactRef, Build, ResourceType, Task
from functions.runtimes.kube.job_plan import JobPlan, KubernetesConfig, plan_for
from tests.support.runs import run_of

CANARY = "canary-7d3f9b2e-do-not-leak"
DIGEST = "sha256:" + "ab" * 32
CONFIG = KubernetesConfig(
    namespace="resource-functions",
    service_account="resource-task",
    task_image="registry.example.com/resource-functions@sha256:" + "cd" * 32,
    ttl_seconds=600,
    margin_seconds=300,
    store_secret="resource-functions-store",
    resources={"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
    reply_sink="http://relay.example",
    build_size_limit="8Gi",
    node_selector={"kubernetes.io/os": "linux"},
    tolerations=({"key": "ci", "operator": "Exists", "effect": "NoSchedule"},),
    image_pull_secrets=("deploy-pull",),
    step_env=(
        ("ARCHIVE_FORMAT", "zstd"),
        ("ARCHIVE_LEVEL", "3"),
        ("AWS_ENDPOINT_URL_S3", "http://minio:9000"),
    ),
)
STORE_URL = "s3://resource-functions/ci"


def make_task(
    action: str = "get",
    *,
    request_id: str = "evt-1",
    secret: str = CANARY,
    resource_type: ResourceType | None = None,
) -> Task:
    source = {
        "uri": "https://git.example.com/repo.git",
        "private_key": secret,
        "nested": [{"token": secret + "-2"}],
    }
    version = {"ref": "abc123"} if action != "put" else None
    params = {"password": secret} if action != "check" else {}
    inputs = (
        {
            "repo": ArtifactRef(key=f"artifacts/{'1' * 64}.tar.zst", digest=DIGEST),
            "notes": ArtifactRef(key="artifacts/notes.tar.gz"),
        }
        if action == "put"
        else {}
    )
    build = Build(id="17", name="42", job="unit", pipeline="main", team="main")
    return Task(
        run_id=run_of(b"test", "//ci.example.com", request_id, action),
        action=action,  # type: ignore[arg-type]
        resource_type=resource_type or ResourceType(image="docker.io/concourse/git-resource:1.17"),
        stdin=protocol.stdin_payload(action, source, version, params),  # type: ignore[arg-type]
        env=protocol.build_env(action, build),
        inputs=inputs,  # type: ignore[arg-type]
        cache_key="c" * 64 if action == "get" else None,
        timeout_seconds=1800,
        request_id=request_id,
        request_source="//ci.example.com",
        subject="pipelines/main",
    )


def make_plan(action: str = "get", *, reply: bool = False, **task_args: Any) -> JobPlan:
    return plan_for(make_task(action, **task_args), CONFIG, STORE_URL, reply=reply)
