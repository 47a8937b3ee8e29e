"""The Tekton Custom Task on the test cluster, for the modules that use it: the ``secured``
deployment (``knative/`` with the ``tekton`` and ``sender-auth`` components, as a user adds
them: ``tests/cluster/secured.py``) and a user namespace labelled as its team by an
administrator (its team is its name), with the StepActions of ``knative/tekton/steps/``. No
store credential is in the namespace: the steps reach the artifacts service with their pod's
token (``TOKEN_VOLUME``, which each Task declares).

    custom_task_in(cluster, secured, namespace) -> CustomTask, for the block
    condition(obj), results(obj): a CustomRun's or PipelineRun's ``Succeeded`` and results
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Self

import pytest
import yaml

from functions import keys
from functions.runtimes.labels import REQUEST_LABEL
from functions.tekton.controller_config import EVENT_SOURCE
from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply
from tests.cluster.conftest import NAMESPACE, KnativeDeployment

CONTROLLER = "app.kubernetes.io/component=tekton-controller"  # its replicas' selector

TEAM_LABEL = "resource-functions.dev/team"
# What a Task declares so that its unpack and pack steps show the pod's identity.
TOKEN_VOLUME = {
    "name": "resource-functions-token",
    "projected": {
        "sources": [
            {
                "serviceAccountToken": {
                    "audience": "resource-functions-artifacts",
                    "expirationSeconds": 600,
                    "path": "token",
                }
            }
        ]
    },
}


@dataclass
class CustomTask:
    cluster: Cluster
    deployment: KnativeDeployment
    store_url: str
    namespace: str  # the Tekton user's: its team

    def controller_logs(self, tail: int = 60) -> str:
        """The last ``tail`` lines (-1: all) of every controller replica, each line prefixed
        with its pod: only the leader posts and writes statuses, whichever it is now."""
        return self.cluster.kubectl(
            "-n", NAMESPACE, "logs", "-l", CONTROLLER, f"--tail={tail}", "--prefix", check=False
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

    def jobs_of(self, request_id: str) -> list[dict]:
        """The Jobs of the request posted with ``request_id`` (a CustomRun's
        ``status.extraFields.requestId``)."""
        label = keys.request_label(EVENT_SOURCE, request_id)
        return self.deployment.jobs(**{REQUEST_LABEL: label})


class EverySecond:
    """A check run each second in a thread while the ``with`` block runs (``check``)."""

    def __init__(self) -> None:
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(1):
            self.check()
            self.polls += 1

    def check(self) -> None:
        raise NotImplementedError


class NoClaims(EverySecond):
    """Every PersistentVolumeClaim seen in any namespace while it runs."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.seen: set[str] = set()

    def check(self) -> None:
        names = self.cluster.kubectl("get", "pvc", "-A", "-o", "name", check=False)
        self.seen |= {line for line in names.splitlines() if line.strip()}


class NoStoreKeys(EverySecond):
    """Every Secret of the pipeline namespaces that holds a store key (any of ``keys``' values,
    raw or base64 as Secrets store them) while it runs: none may."""

    def __init__(self, cluster: Cluster, keys: dict[str, str], namespaces: tuple[str, ...]):
        super().__init__()
        self.cluster = cluster
        self.values = {v for k, v in keys.items() if "SECRET" in k or "ACCESS_KEY" in k}
        self.values |= {base64.b64encode(v.encode()).decode() for v in set(self.values)}
        self.namespaces = namespaces
        self.found: dict[str, str] = {}

    def check(self) -> None:
        for namespace in self.namespaces:
            listed = self.cluster.run_kubectl("-n", namespace, "get", "secrets", "-o", "json")
            if listed.returncode != 0:
                continue
            for secret in json.loads(listed.stdout).get("items", []):
                if any(value in json.dumps(secret.get("data") or {}) for value in self.values):
                    self.found[f"{namespace}/{secret['metadata']['name']}"] = "a store key"


def request_id(run: dict) -> str:
    """The request id of a CustomRun's attempt under way (or last)."""
    return str(((run.get("status") or {}).get("extraFields") or {}).get("requestId") or "")


def condition(obj: dict) -> dict:
    found = [
        c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Succeeded"
    ]
    return found[0] if found else {}


def results(obj: dict) -> dict[str, str]:
    return {r["name"]: r["value"] for r in (obj.get("status") or {}).get("results") or []}


@contextmanager
def custom_task_in(cluster: Cluster, secured: object, namespace: str) -> Iterator[CustomTask]:
    """The user namespace ``namespace`` (labelled as its team), its StepActions from a copy of
    ``knative/tekton/steps/`` with the deployment's image; ``secured``: a ``Secured``."""
    deployment: KnativeDeployment = secured.deployment  # type: ignore[attr-defined]
    base = deployment.overlay.parent / "knative"
    store_url = cluster.kubectl(
        "-n",
        NAMESPACE,
        "get",
        "configmap",
        "resource-functions-config",
        "-o",
        "jsonpath={.data.STORE_URL}",
    ).strip()
    labels = {TEAM_LABEL: namespace}
    apply(
        cluster,
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": labels},
            }
        ],
    )
    steps = base.parent / f"steps-{namespace}"
    shutil.copytree(base / "tekton" / "steps", steps)
    step_kustomization = yaml.safe_load((steps / "kustomization.yaml").read_text())
    step_kustomization["namespace"] = namespace
    step_kustomization["images"] = yaml.safe_load((base / "kustomization.yaml").read_text())[
        "images"
    ]
    (steps / "kustomization.yaml").write_text(yaml.safe_dump(step_kustomization))
    cluster.kubectl("apply", "-k", str(steps))
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
