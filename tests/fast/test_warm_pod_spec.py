"""The warm check pod (docs/warm-checks.md), checked as data against the official schemas:
the task pod's account, security, resources and placement; the pause program copied by an
init container of the project image and run by the resource container; nothing of the
request in it; a deadline at its maximum age."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import kubernetes_validate
import pytest

from functions.model import ResourceType
from functions.runtimes.kube.podspec import job_manifest
from functions.runtimes.labels import WARM_POD_KEY_LABEL, WARM_POD_OWNER_LABEL
from functions.runtimes.warm.agent import PORT
from functions.runtimes.warm.pod_manifest import (
    AGENT_IN_TASK_IMAGE,
    AGENT_PROGRAM,
    PAUSE_IN_TASK_IMAGE,
    PAUSE_PROGRAM,
    TOOLS_DIR,
    owner_label,
    token_secret,
    warm_pod_manifest,
    warm_pod_name,
)
from functions.settings import WarmLimits
from tests.support.job_plans import CANARY, CONFIG, make_plan

VERSIONS = ("1.30", "1.37")
KEY = "f" * 32
OWNER = "check-00001-deployment-5d8f7c9b4-x2x7q"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def warm_pod(**plan_changes: object) -> dict:
    plan = replace(make_plan("check"), **plan_changes)  # type: ignore[arg-type]
    return warm_pod_manifest(plan, KEY, OWNER, WarmLimits(max_age_seconds=3600))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_warm_pod_validates_strictly(version: str) -> None:
    kubernetes_validate.validate(warm_pod(), version, strict=True)
    kubernetes_validate.validate(warm_pod(privileged=True), version, strict=True)


def test_the_resource_container_runs_the_agent_the_init_container_copied() -> None:
    pod = warm_pod()
    spec = pod["spec"]
    (copy,) = spec["initContainers"]
    (resource,) = spec["containers"]
    assert copy["image"] == CONFIG.task_image
    assert copy["command"] == ["cp", PAUSE_IN_TASK_IMAGE, AGENT_IN_TASK_IMAGE, f"{TOOLS_DIR}/"]
    assert resource["image"] == "docker.io/concourse/git-resource:1.17"
    assert resource["command"][:3] == [PAUSE_PROGRAM, "--", AGENT_PROGRAM]
    assert resource["command"][3] == "serve"
    assert resource["ports"] == [{"name": "agent", "containerPort": PORT, "protocol": "TCP"}]
    assert resource["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": PORT}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in resource["volumeMounts"]}
    assert copy["volumeMounts"][0]["name"] in mounts and mounts["tools"]["readOnly"] is True
    assert "emptyDir" in volumes["tools"] and "emptyDir" in volumes["sources"]
    token = volumes["agent-token"]["secret"]
    secret = token_secret(pod["metadata"]["name"], "uid-1", make_plan("check"), "t" * 64)
    assert token["secretName"] == secret["metadata"]["name"]
    assert secret["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod["metadata"]["name"],
        "uid": "uid-1",
    }
    kubernetes_validate.validate(secret, VERSIONS[-1], strict=True)
    assert copy["securityContext"]["runAsNonRoot"] is True
    assert copy["securityContext"]["readOnlyRootFilesystem"] is True


def test_it_is_placed_and_limited_as_a_task_pod() -> None:
    task_pod = job_manifest(make_plan("check"))["spec"]["template"]["spec"]
    spec = warm_pod()["spec"]
    for field in (
        "serviceAccountName",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "securityContext",
        "nodeSelector",
        "tolerations",
        "imagePullSecrets",
    ):
        assert spec[field] == task_pod[field], field
    resource = spec["containers"][0]
    task_resource = next(c for c in task_pod["initContainers"] if c["name"] == "resource")
    assert resource["resources"] == task_resource["resources"]
    assert resource["securityContext"] == task_resource["securityContext"]
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 3600 + 1800  # its maximum age and one check


def test_nothing_of_the_request_is_in_it() -> None:
    """No request, no source and no credential: the only Secret is the agent's token."""
    text = json.dumps(warm_pod())
    assert CANARY not in text and "git.example.com" not in text
    secrets = [v["name"] for v in warm_pod()["spec"]["volumes"] if "secret" in v]
    assert secrets == ["agent-token"]
    assert "env" not in warm_pod()["spec"]["containers"][0]


def test_names_and_labels_are_valid_and_hide_the_owner() -> None:
    pod = warm_pod()
    labels = pod["metadata"]["labels"]
    assert labels[WARM_POD_KEY_LABEL] == KEY
    assert labels[WARM_POD_OWNER_LABEL] == owner_label(OWNER) != OWNER
    assert labels["app.kubernetes.io/managed-by"] == "resource-functions"
    for value in labels.values():
        assert len(value) <= 63 and LABEL_VALUE.match(value)
    names = {pod["metadata"]["name"], *(warm_pod_name() for _ in range(20))}
    assert len(names) == 21  # a key may have several pods: each its own name
    assert all(re.fullmatch(r"rf-warm-[0-9a-f]{20}", name) for name in names)


def test_a_privileged_type_keeps_its_privilege() -> None:
    plan = make_plan("check", resource_type=ResourceType(image="x/y:1", privileged=True))
    pod = warm_pod_manifest(plan, KEY, OWNER, WarmLimits(max_age_seconds=60))
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": True}


def test_a_priority_class_set_is_the_pods_own_quota_scope() -> None:
    plan = make_plan("check")
    limits = WarmLimits(priority_class="resource-functions-warm-check")
    pod = warm_pod_manifest(plan, KEY, OWNER, limits)
    assert pod["spec"]["priorityClassName"] == "resource-functions-warm-check"
    kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)
    assert "priorityClassName" not in warm_pod()["spec"]
