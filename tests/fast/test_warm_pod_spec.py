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
from functions.runtimes.labels import WARM_POD_KEY_LABEL, WARM_POD_OWNER_LABEL
from functions.runtimes.podspec import job_manifest
from functions.runtimes.warm_podspec import (
    PAUSE_IN_TASK_IMAGE,
    PAUSE_PROGRAM,
    owner_label,
    warm_pod_manifest,
    warm_pod_name,
)
from tests.support.job_plans import CANARY, CONFIG, make_plan

VERSIONS = ("1.30", "1.37")
KEY = "f" * 32
OWNER = "check-00001-deployment-5d8f7c9b4-x2x7q"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def warm_pod(**plan_changes: object) -> dict:
    plan = replace(make_plan("check"), **plan_changes)  # type: ignore[arg-type]
    return warm_pod_manifest(plan, KEY, OWNER, max_age_seconds=3600)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_warm_pod_validates_strictly(version: str) -> None:
    kubernetes_validate.validate(warm_pod(), version, strict=True)
    kubernetes_validate.validate(warm_pod(privileged=True), version, strict=True)


def test_the_resource_container_runs_the_copied_pause_program() -> None:
    spec = warm_pod()["spec"]
    (copy,) = spec["initContainers"]
    (resource,) = spec["containers"]
    assert copy["image"] == CONFIG.task_image
    assert copy["command"] == ["cp", PAUSE_IN_TASK_IMAGE, PAUSE_PROGRAM]
    assert resource["image"] == "docker.io/concourse/git-resource:1.17"
    assert resource["command"] == [PAUSE_PROGRAM, "-P"]
    (volume,) = spec["volumes"]
    assert "emptyDir" in volume
    assert copy["volumeMounts"][0]["name"] == resource["volumeMounts"][0]["name"] == volume["name"]
    assert resource["volumeMounts"][0]["readOnly"] is True
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
    text = json.dumps(warm_pod())
    assert CANARY not in text and "git.example.com" not in text
    assert "secret" not in json.dumps(warm_pod()["spec"]["volumes"])
    assert "env" not in warm_pod()["spec"]["containers"][0]


def test_names_and_labels_are_valid_and_hide_the_owner() -> None:
    pod = warm_pod()
    labels = pod["metadata"]["labels"]
    assert labels[WARM_POD_KEY_LABEL] == KEY
    assert labels[WARM_POD_OWNER_LABEL] == owner_label(OWNER) != OWNER
    assert labels["app.kubernetes.io/managed-by"] == "resource-functions"
    for value in labels.values():
        assert len(value) <= 63 and LABEL_VALUE.match(value)
    assert pod["metadata"]["name"] == warm_pod_name(KEY, OWNER)
    assert warm_pod_name(KEY, "another-replica") != warm_pod_name(KEY, OWNER)
    assert warm_pod_name("e" * 32, OWNER) != warm_pod_name(KEY, OWNER)
    assert len(pod["metadata"]["name"]) <= 63


def test_a_privileged_type_keeps_its_privilege() -> None:
    plan = make_plan("check", resource_type=ResourceType(image="x/y:1", privileged=True))
    pod = warm_pod_manifest(plan, KEY, OWNER, max_age_seconds=60)
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": True}
