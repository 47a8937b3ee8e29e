"""The Pod of a warm check (docs/warm-checks.md), a plain dict built by a pure function from
the check's ``JobPlan``, as ``podspec`` builds the task Job: the resource image's container
runs a static pause program, which an init container of the project image copies into an
emptyDir (as Tekton injects its entrypoint); each check is a ``pods/exec`` of the check
script (``warm_pods``).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from functions.runtimes.job_plan import JobPlan
from functions.runtimes.labels import (
    ACTION_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    WARM_POD_KEY_LABEL,
    WARM_POD_OWNER_LABEL,
)
from functions.runtimes.podspec import pod_spec, resource_container, step_container
from functions.steps.pod_contract import MANAGED_BY

PAUSE_VOLUME = "pause"
PAUSE_DIR = "/.rf-pause"
PAUSE_PROGRAM = f"{PAUSE_DIR}/pause"
PAUSE_IN_TASK_IMAGE = "/usr/bin/catatonit"  # the project image's (Dockerfile), static


def warm_pod_name(key: str, owner: str) -> str:
    """``rf-warm-<20 hex>``: one per key and owning replica (replicas never share one)."""
    digest = hashlib.sha256(f"{key}/{owner}".encode()).hexdigest()
    return f"rf-warm-{digest[:20]}"


def owner_label(owner: str) -> str:
    """A label value naming the owning replica (its pod name, which may be long)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


def warm_pod_manifest(
    plan: JobPlan, key: str, owner: str, max_age_seconds: float
) -> dict[str, Any]:
    """The Pod of one warm check container: the task pod's account, security context,
    resources and placement; the pause program as the resource container's main process;
    ``activeDeadlineSeconds`` ends it at its maximum age (plus one check's budget) even if
    its replica is gone. No Secret, no stdin: each check brings its request on the exec's
    stdin. ``plan``: the check's ``JobPlan``."""
    pod_labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        NAME_LABEL: "resource-functions",
        ACTION_LABEL: "check",
        WARM_POD_KEY_LABEL: key,
        WARM_POD_OWNER_LABEL: owner_label(owner),
    }
    copy = step_container(plan, "pause", [], stdin=False)
    copy["command"] = ["cp", PAUSE_IN_TASK_IMAGE, PAUSE_PROGRAM]
    copy["volumeMounts"] = [{"name": PAUSE_VOLUME, "mountPath": PAUSE_DIR}]
    copy["env"] = []
    copy.pop("terminationMessagePolicy", None)
    resource = resource_container(plan)
    resource["command"] = [PAUSE_PROGRAM, "-P"]
    resource["volumeMounts"] = [{"name": PAUSE_VOLUME, "mountPath": PAUSE_DIR, "readOnly": True}]
    resource.pop("env", None)
    spec = pod_spec(plan)
    spec.update(
        {
            "activeDeadlineSeconds": math.ceil(max_age_seconds + plan.timeout_seconds),
            "initContainers": [copy],
            "containers": [resource],
            "volumes": [{"name": PAUSE_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": warm_pod_name(key, owner),
            "namespace": plan.namespace,
            "labels": pod_labels,
        },
        "spec": spec,
    }
