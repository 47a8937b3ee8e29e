"""The Tekton Custom Task on the test cluster, for the modules that use it: ``knative/``
applied with the ``tekton`` component the way a user adds it (``components:`` in
``knative/kustomization.yaml``, then ``kubectl apply -k``), and a user namespace (its team is
its name) with the StepActions of ``knative/tekton/steps/`` and a ``store`` Secret.

    custom_task_in(cluster, deployment, namespace, store_env) -> CustomTask, for the block
    condition(obj), results(obj): a CustomRun's or PipelineRun's ``Succeeded`` and results
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import yaml

from functions import keys
from functions.runtimes.podspec import REQUEST_LABEL
from functions.tekton.controller_config import EVENT_SOURCE
from tests.cluster.conftest import NAMESPACE, KnativeDeployment, wait_ready
from tests.cluster.knative import apply
from tests.cluster.up import Cluster

API_VERSION = "resource-functions.dev/v1alpha1"


@dataclass
class CustomTask:
    cluster: Cluster
    deployment: KnativeDeployment
    store_url: str
    namespace: str  # the Tekton user's: its team

    def controller_logs(self) -> str:
        return self.cluster.kubectl(
            "-n", NAMESPACE, "logs", "deployment/tekton-controller", "--tail=60", check=False
        )

    def get(self, kind: str, name: str) -> dict:
        out = self.cluster.kubectl(
            "-n", self.namespace, "get", kind, name, "-o", "json", check=False
        )
        return json.loads(out) if out else {}

    def list(self, kind: str, selector: str = "") -> list[dict]:
        args = ["-n", self.namespace, "get", kind, "-o", "json"]
        found = json.loads(self.cluster.kubectl(*args, *(["-l", selector] if selector else [])))
        return found["items"]

    def wait(self, kind: str, name: str, done: Callable[[dict], bool], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            found = self.get(kind, name)
            if found and done(found):
                return found
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{kind}/{name} not there after {timeout}s: "
                    f"{json.dumps(found.get('status'))[-3000:]}\n"
                    f"--- controller ---\n{self.controller_logs()}"
                )
            time.sleep(1)

    def finished(self, kind: str, name: str, timeout: float = 240) -> dict:
        return self.wait(
            kind, name, lambda o: condition(o).get("status") in ("True", "False"), timeout
        )

    def jobs_of(self, uid: str) -> list[dict]:
        label = keys.request_label(EVENT_SOURCE, uid)
        return self.deployment.jobs(**{REQUEST_LABEL: label})


def condition(obj: dict) -> dict:
    found = [
        c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Succeeded"
    ]
    return found[0] if found else {}


def results(obj: dict) -> dict[str, str]:
    return {r["name"]: r["value"] for r in (obj.get("status") or {}).get("results") or []}


@contextmanager
def custom_task_in(
    cluster: Cluster, deployment: KnativeDeployment, namespace: str, store_env: dict[str, str]
) -> Iterator[CustomTask]:
    base = deployment.overlay.parent / "knative"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    kustomization["components"] = ["tekton"]
    (base / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    cluster.kubectl("apply", "-k", str(deployment.overlay))
    wait_ready(
        cluster, NAMESPACE, ["sinkbinding/tekton-controller-requests", "trigger/tekton-replies"]
    )
    wait_sink_injected(cluster)
    store_url = cluster.kubectl(
        "-n",
        NAMESPACE,
        "get",
        "configmap",
        "resource-functions-config",
        "-o",
        "jsonpath={.data.STORE_URL}",
    ).strip()

    apply(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    steps = base / "tekton" / "steps"
    step_kustomization = yaml.safe_load((steps / "kustomization.yaml").read_text())
    step_kustomization["namespace"] = namespace
    step_kustomization["images"] = kustomization["images"]
    (steps / "kustomization.yaml").write_text(yaml.safe_dump(step_kustomization))
    cluster.kubectl("apply", "-k", str(steps))
    secret = {"name": "store", "namespace": namespace}
    apply(
        cluster,
        [{"apiVersion": "v1", "kind": "Secret", "metadata": secret, "stringData": store_env}],
    )
    deadline = time.monotonic() + 30  # task pods need the namespace's default account
    while not cluster.kubectl("-n", namespace, "get", "sa", "default", "-o", "name", check=False):
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.2)
    try:
        yield CustomTask(cluster, deployment, store_url, namespace)
    finally:
        shutil.rmtree(steps, ignore_errors=True)


def wait_sink_injected(cluster: Cluster, timeout: float = 180) -> None:
    """Until the controller's rollout with K_SINK (the SinkBinding's) is complete."""
    deadline = time.monotonic() + timeout
    while True:
        deployment = json.loads(
            cluster.kubectl("-n", NAMESPACE, "get", "deployment", "tekton-controller", "-o", "json")
        )
        env = deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
        if any(e["name"] == "K_SINK" for e in env):
            cluster.kubectl(
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                "deployment/tekton-controller",
                "--timeout=180s",
            )
            return
        assert time.monotonic() < deadline, "the SinkBinding gave the controller no K_SINK"
        time.sleep(1)
