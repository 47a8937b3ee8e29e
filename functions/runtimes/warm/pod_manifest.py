"""The Pod of a warm check and its token's Secret (docs/warm-checks.md), plain dicts built by
pure functions from the check's ``JobPlan``, as ``podspec`` builds the task Job: the resource
image's container runs ``rf-agent serve`` under a static pause program, both of which an
init container of the project image copies into an emptyDir (as Tekton injects its
entrypoint); the sources' directories are an emptyDir of their own; the agent's token is a
Secret the pod owns. Each check goes to the agent over the pod network (``pods``).
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

from functions.runtimes.kube.job_plan import JobPlan
from functions.runtimes.kube.podspec import pod_spec, resource_container, step_container
from functions.runtimes.labels import (
    ACTION_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    WARM_POD_KEY_LABEL,
    WARM_POD_OWNER_LABEL,
)
from functions.runtimes.warm.agent import PORT
from functions.settings import WarmLimits
from functions.steps.pod_contract import MANAGED_BY

TOOLS_VOLUME, SOURCES_VOLUME, TOKEN_VOLUME = "tools", "sources", "agent-token"
TOOLS_DIR = "/.rf-pause"
PAUSE_PROGRAM, AGENT_PROGRAM = f"{TOOLS_DIR}/catatonit", f"{TOOLS_DIR}/rf-agent"
SOURCES_DIR = "/rf/sources"
TOKEN_DIR = "/rf/agent"
# Static programs of the project image (Dockerfile).
PAUSE_IN_TASK_IMAGE, AGENT_IN_TASK_IMAGE = "/usr/bin/catatonit", "/usr/bin/rf-agent"


def warm_pod_name() -> str:
    """``rf-warm-<20 hex>``, random: a new name each time (a key may have several pods),
    none another replica's."""
    return f"rf-warm-{os.urandom(10).hex()}"


def owner_label(owner: str) -> str:
    """A label value naming the owning replica (its pod name, which may be long)."""
    return _hex(owner)[:32]


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def warm_pod_manifest(plan: JobPlan, key: str, owner: str, limits: WarmLimits) -> dict[str, Any]:
    """The Pod of one warm check container: the task pod's account, security context,
    resources and placement; ``rf-agent serve`` under the pause program as the resource
    container's main processes, Ready once the agent answers; ``activeDeadlineSeconds`` ends
    it at its maximum age (plus one check's budget) even if its replica is gone. No request,
    no source, no credential: each check brings its request to the agent. ``plan``: the
    check's ``JobPlan``."""
    pod_labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        NAME_LABEL: "resource-functions",
        ACTION_LABEL: "check",
        WARM_POD_KEY_LABEL: key,
        WARM_POD_OWNER_LABEL: owner_label(owner),
    }
    name = warm_pod_name()
    copy = step_container(plan, "tools", [], stdin=False)
    copy["command"] = ["cp", PAUSE_IN_TASK_IMAGE, AGENT_IN_TASK_IMAGE, f"{TOOLS_DIR}/"]
    copy["volumeMounts"] = [{"name": TOOLS_VOLUME, "mountPath": TOOLS_DIR}]
    copy["env"] = []
    copy.pop("terminationMessagePolicy", None)
    resource = resource_container(plan)
    resource["command"] = [PAUSE_PROGRAM, "--", *agent_command(limits)]
    resource["ports"] = [{"name": "agent", "containerPort": PORT, "protocol": "TCP"}]
    resource["readinessProbe"] = {
        "httpGet": {"path": "/healthz", "port": PORT},
        "periodSeconds": 1,
        "timeoutSeconds": 5,
    }
    resource["volumeMounts"] = [
        {"name": TOOLS_VOLUME, "mountPath": TOOLS_DIR, "readOnly": True},
        {"name": SOURCES_VOLUME, "mountPath": SOURCES_DIR},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    resource.pop("env", None)
    spec = pod_spec(plan)
    spec.update(
        {
            "activeDeadlineSeconds": math.ceil(limits.max_age_seconds + plan.timeout_seconds),
            **({"priorityClassName": limits.priority_class} if limits.priority_class else {}),
            "initContainers": [copy],
            "containers": [resource],
            "volumes": [
                {"name": TOOLS_VOLUME, "emptyDir": {"sizeLimit": "32Mi"}},
                {"name": SOURCES_VOLUME, "emptyDir": _size(plan.build_size_limit)},
                {
                    "name": TOKEN_VOLUME,
                    "secret": {"secretName": token_secret_name(name), "defaultMode": 0o444},
                },
            ],
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": plan.namespace, "labels": pod_labels},
        "spec": spec,
    }


def _size(limit: str) -> dict[str, str]:
    return {"sizeLimit": limit} if limit else {}


def agent_command(limits: WarmLimits) -> list[str]:
    return [
        AGENT_PROGRAM,
        "serve",
        "--listen",
        f":{PORT}",
        "--token-file",
        f"{TOKEN_DIR}/token",
        "--root",
        SOURCES_DIR,
        "--max-checks",
        str(limits.checks_at_once),
        "--idle-seconds",
        str(int(limits.idle_seconds)),
    ]


def token_secret_name(pod: str) -> str:
    return f"{pod}-agent"


def token_secret(pod: str, pod_uid: str, plan: JobPlan, token: str) -> dict[str, Any]:
    """The Secret holding the pod's agent token, owned by the pod (deleted with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(pod),
            "namespace": plan.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}],
        },
        "type": "Opaque",
        "stringData": {"token": token},
    }
