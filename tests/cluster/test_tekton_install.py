"""Tekton Pipelines and Triggers on the test cluster (``tekton.py``): a smoke test of the install.

- A Task of two busybox steps (the controller's shell image), one with an explicit
  ``command:`` and one with a ``script:`` (so the shell image's ``place-scripts`` init container
  runs too), each writing a result: its TaskRun Succeeds and both results are read from its
  status. With no registry, a step must not leave its command to the image's config.
- An EventListener with a TriggerBinding and a TriggerTemplate and no interceptor, POSTed a JSON
  body from this machine at the ``el-NAME`` Service's cluster IP, port 8080, answers 202 and
  creates a TaskRun named by a body field (which then Succeeds). The same body POSTed again is
  answered 202 too, and its create conflicts (the listener logs ``problem creating obj`` with
  ``already exists``): one TaskRun.
- Sent a CloudEvent in binary mode (``ce-*`` headers), the EventListener answers with a
  CloudEvent of its own, in binary mode: 202, ``ce-specversion: 1.0``,
  ``ce-type: dev.tekton.event.triggers.accepted.v1``, ``ce-source`` the listener's name,
  ``ce-id`` its own event id (not the request's), ``ce-subject``
  ``<namespace>.<listener> accepted <event id>``, ``content-type: application/json`` and the
  body ``{"eventListener", "namespace", "eventListenerUID", "eventID"}``. A plain JSON request
  gets 202 and the same body (``application/json``) with no ``ce-*`` header. Either way the
  answer only says that the event was accepted: the listener runs its triggers in goroutines
  that the answer does not wait for (read in its sources), so a failed create (the conflict
  above) is still answered 202.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply
from tests.cluster.conftest import wait_ready
from tests.support import tekton_pipelines as pipelines

NAMESPACE = "tekton-smoke"
LISTENER = "smoke"
TEKTON_NAMESPACES = (NAMESPACE,)  # shown by conftest when a test fails


def resources(shell: str) -> list[dict]:
    """The namespace, the listener's account and bindings, the Task and the trigger."""
    meta = {"namespace": NAMESPACE}
    greeting = 'printf "hello %s" "$(params.who)" > "$(results.greeting.path)"'
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "listener", **meta}},
        binding("RoleBinding", "tekton-triggers-eventlistener-roles", meta),
        binding("ClusterRoleBinding", "tekton-triggers-eventlistener-clusterroles", {}),
        pipelines.tekton_object(
            "Task",
            "greet",
            NAMESPACE,
            {
                "params": [{"name": "who", "type": "string"}],
                "results": [{"name": "greeting"}, {"name": "shell"}],
                "steps": [
                    {"name": "greet", "image": shell, "command": ["/bin/sh", "-c", greeting]},
                    {
                        "name": "script",
                        "image": shell,
                        "script": 'printf "script ran" > "$(results.shell.path)"',
                    },
                ],
            },
        ),
        {
            "apiVersion": "triggers.tekton.dev/v1beta1",
            "kind": "TriggerBinding",
            "metadata": {"name": "from-body", **meta},
            "spec": {
                "params": [
                    {"name": "run", "value": "$(body.run)"},
                    {"name": "who", "value": "$(body.who)"},
                ]
            },
        },
        {
            "apiVersion": "triggers.tekton.dev/v1beta1",
            "kind": "TriggerTemplate",
            "metadata": {"name": "greet-run", **meta},
            "spec": {
                "params": [{"name": "run"}, {"name": "who"}],
                "resourcetemplates": [task_run("$(tt.params.run)", "$(tt.params.who)")],
            },
        },
        {
            "apiVersion": "triggers.tekton.dev/v1beta1",
            "kind": "EventListener",
            "metadata": {"name": LISTENER, **meta},
            "spec": {
                "serviceAccountName": "listener",
                "triggers": [
                    {
                        "name": "greet",
                        "bindings": [{"ref": "from-body", "kind": "TriggerBinding"}],
                        "template": {"ref": "greet-run"},
                    }
                ],
            },
        },
    ]


def binding(kind: str, role: str, meta: dict) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": f"{NAMESPACE}-listener", **meta},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "listener", "namespace": NAMESPACE}],
    }


def task_run(name: str, who: str) -> dict:
    return pipelines.task_run(name, NAMESPACE, "greet", {"who": who})


def succeeded(cluster: Cluster, name: str, timeout: float = 120) -> dict[str, str]:
    """The results of TaskRun ``name`` once it has Succeeded."""
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.kubectl("-n", NAMESPACE, "get", "taskrun", name, "-o", "json", check=False)
        status = json.loads(got).get("status", {}) if got else {}
        done = [c for c in status.get("conditions", []) if c["type"] == "Succeeded"]
        if done and done[0]["status"] == "True":
            return {r["name"]: r["value"] for r in status.get("results", [])}
        if (done and done[0]["status"] == "False") or time.monotonic() > deadline:
            pods = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide", check=False)
            pytest.fail(f"TaskRun {name} did not succeed: {json.dumps(status)[-3000:]}\n{pods}")
        time.sleep(1)


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` as JSON, retried while the listener is not answering yet."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json", **headers}
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                headers = {k.lower(): v for k, v in answer.headers.items()}
                return answer.status, headers, answer.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_log(cluster: Cluster, texts: tuple[str, ...], timeout: float = 30) -> None:
    """Until a line of the listener's log holds every one of ``texts``."""
    deadline = time.monotonic() + timeout
    while True:
        logs = cluster.kubectl("-n", NAMESPACE, "logs", f"deployment/el-{LISTENER}", check=False)
        if any(all(t in line for t in texts) for line in logs.splitlines()):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the listener logged no line with {texts}: {logs[-3000:]}")
        time.sleep(0.5)


def test_task_run_and_event_listener(cluster: Cluster, tekton) -> None:
    apply(cluster, resources(tekton.shell_image))
    deadline = time.monotonic() + 30  # task pods need the namespace's default account
    while not cluster.kubectl("-n", NAMESPACE, "get", "sa", "default", "-o", "name", check=False):
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.2)

    apply(cluster, [task_run("direct", "direct")])
    assert succeeded(cluster, "direct") == {"greeting": "hello direct", "shell": "script ran"}

    wait_ready(cluster, NAMESPACE, [f"eventlistener/{LISTENER}"], timeout=120)
    ip = cluster.kubectl(
        "-n", NAMESPACE, "get", "service", f"el-{LISTENER}", "-o", "jsonpath={.spec.clusterIP}"
    ).strip()
    url = f"http://{ip}:8080"
    body = {"run": f"from-listener-{uuid.uuid4().hex[:8]}", "who": "listener"}
    answers = [post(url, body, {}) for _ in range(2)]
    assert [status for status, _, _ in answers] == [202, 202]
    assert answers[0][1]["content-type"] == "application/json"
    assert not [k for _, headers, _ in answers for k in headers if k.startswith("ce-")]
    assert json.loads(answers[0][2])["eventListener"] == LISTENER
    assert succeeded(cluster, body["run"])["greeting"] == "hello listener"
    wait_log(cluster, ("problem creating obj", body["run"], "already exists"))
    runs = cluster.kubectl(
        "-n",
        NAMESPACE,
        "get",
        "taskrun",
        "-l",
        f"triggers.tekton.dev/eventlistener={LISTENER}",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ).split()
    assert runs == [body["run"]]

    event = {"run": f"from-event-{uuid.uuid4().hex[:8]}", "who": "event"}
    ce = {
        "ce-specversion": "1.0",
        "ce-id": "request-1",
        "ce-source": "/tests/tekton",
        "ce-type": "dev.resource-functions.test",
    }
    status, headers, reply = post(url, event, ce)
    accepted = json.loads(reply)
    assert status == 202
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-type"] == "dev.tekton.event.triggers.accepted.v1"
    assert headers["ce-source"] == LISTENER
    assert headers["ce-id"] == accepted["eventID"] != ce["ce-id"]
    assert headers["ce-subject"] == f"{NAMESPACE}.{LISTENER} accepted {accepted['eventID']}"
    assert headers["content-type"].startswith("application/json")
    assert accepted["namespace"] == NAMESPACE
    assert succeeded(cluster, event["run"])["greeting"] == "hello event"
