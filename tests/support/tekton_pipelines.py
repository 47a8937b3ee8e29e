"""Tekton objects as the tests write them, one builder each: the Tasks, Pipelines and their
runs of the cluster tier, and the CustomRuns of the project's Custom Task that the fast tier
feeds its controller and the cluster tier creates.

    tekton_object(kind, name, namespace, spec)   a tekton.dev/v1 object (Task, Pipeline, …)
    pipeline_run(name, namespace, pipeline, values, workspaces)
    task_run(name, namespace, task, values, **spec)
    custom_run(name, namespace, values, kind="Get", **spec)
    custom_task_ref(kind)                        a Pipeline task's taskRef to Get or Put
    params(values)                               {name: value} as Tekton's param list
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from functions.tekton.params import API_VERSION

PIPELINES_API = "tekton.dev/v1"
CUSTOM_RUN_API = "tekton.dev/v1beta1"


def params(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def tekton_object(kind: str, name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Tekton Pipelines object of ``kind`` (Task, Pipeline, PipelineRun, TaskRun)."""
    return {
        "apiVersion": PIPELINES_API,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pipeline_run(
    name: str,
    namespace: str,
    pipeline: str,
    values: Mapping[str, str],
    workspaces: list[dict[str, Any]],
) -> dict[str, Any]:
    spec = {"pipelineRef": {"name": pipeline}, "params": params(values), "workspaces": workspaces}
    return tekton_object("PipelineRun", name, namespace, spec)


def task_run(
    name: str, namespace: str, task: str, values: Mapping[str, str], **spec: Any
) -> dict[str, Any]:
    return tekton_object(
        "TaskRun", name, namespace, {"taskRef": {"name": task}, "params": params(values), **spec}
    )


def custom_task_ref(kind: str) -> dict[str, str]:
    """The reference to the project's Custom Task ``kind`` (``Get`` or ``Put``)."""
    return {"apiVersion": API_VERSION, "kind": kind}


def custom_run(
    name: str, namespace: str, values: Mapping[str, str], kind: str = "Get", **spec: Any
) -> dict[str, Any]:
    """A CustomRun of the project's Custom Task ``kind``, its params ``values``."""
    return {
        "apiVersion": CUSTOM_RUN_API,
        "kind": "CustomRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"customRef": custom_task_ref(kind), "params": params(values), **spec},
    }


DEEP = "__nested__"  # where ``hostile_custom_run`` nests its value
HOSTILE_PLACES = ("customSpec.spec", "params[].value", "customRef.params[].value")


def nested(depth: int) -> str:
    """JSON text of an object nested ``depth`` levels deep (``json.dumps`` would recurse)."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def hostile_custom_run(name: str, namespace: str, place: str, depth: int = 3000) -> str:
    """JSON text of a CustomRun of the project's that a tenant may create (neither the API
    server nor Tekton's webhook bounds these fields) with an object nested ``depth`` levels
    deep at ``place``, one of ``HOSTILE_PLACES``."""
    run = custom_run(name, namespace, {"type": "git"}, kind="Check")
    spec = run["spec"]
    if place == "customSpec.spec":
        spec["customSpec"] = {**spec.pop("customRef"), "spec": DEEP}
    elif place == "params[].value":
        spec["params"].append({"name": "source", "value": DEEP})
    elif place == "customRef.params[].value":
        spec["customRef"]["params"] = [{"name": "source", "value": DEEP}]
    else:
        raise ValueError(f"no place {place!r}: one of {HOSTILE_PLACES}")
    return json.dumps(run).replace(json.dumps(DEEP), nested(depth))


def large_custom_run(name: str, namespace: str, size: int) -> dict[str, Any]:
    """A CustomRun of the project's whose params take about ``size`` bytes of JSON."""
    values = {"type": "git", "source": json.dumps({"pad": "x" * size})}
    return custom_run(name, namespace, values, kind="Check")
