"""The Tekton Custom Task on the real cluster (issue 29): ``knative/`` applied with the
``tekton`` component, Tekton Pipelines installed (the ``tekton`` fixture), the StepActions of
``knative/tekton/steps/`` in a user namespace whose team is its name.

- A Pipeline whose first task is a ``Get`` CustomRun (the test resource image) and whose
  second is a Task that unpacks the Get's ``artifact`` into an emptyDir workspace (the
  ``resource-functions-unpack`` StepAction, store credentials from a Secret volume) and reads
  the files; a third Task writes a directory and packs it (``resource-functions-pack``), and a
  ``Put`` CustomRun takes that artifact as its input: the PipelineRun succeeds with what the
  files say, the put saw the packed file; no PersistentVolumeClaim exists anywhere.
- A failing get: the PipelineRun fails; its CustomRun is ``False`` with the failure kind as
  reason and the resource's (redacted) log tail in the message.
- A controller killed mid-run: the restarted controller posts the same request again (the
  Broker's sink sees the event id twice), the functions attach it to the run under way (one
  Job, one pod), and the CustomRun completes.
- New versions start PipelineRuns (``knative/tekton/examples/``): a ``version.discovered``
  event posted into the Broker twice (a redelivery) starts one PipelineRun, named after the
  event, which succeeds; the EventListener's CloudEvent answer never reaches the Broker.
- A bad param: ``False``, ``InvalidParams``, the message naming the param; no request posted
  (the Broker's sink never sees the event id) and no Job.
- Cancelling a running get (``spec.status: RunCancelled``): ``CustomRunCancelled``, and its
  Job is deleted.
- A failing get with ``retries: 1``: two attempts (two Jobs, request ids ``<uid>`` and
  ``<uid>-r1``), the first in ``retriesStatus``, then ``False``.
- A get past its ``spec.timeout``: ``CustomRunTimedOut``, and its Job is deleted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import NAMESPACE, KnativeDeployment, wait_ready
from tests.cluster.custom_task import API_VERSION, CustomTask, condition, custom_task_in, results
from tests.cluster.knative import apply
from tests.cluster.up import Cluster

USERS = "tekton-ct"  # a Tekton user's namespace: its team is "tekton-ct"
TEKTON_NAMESPACES = (USERS,)  # shown by conftest when a test fails
PASSWORD = "tekton-canary-7f3a"  # in a get's params: must never show in a status


@pytest.fixture(scope="module")
def custom_task(
    cluster: Cluster, knative_deployment: KnativeDeployment, tekton, gateway_s3
) -> Iterator[CustomTask]:
    """The component and the user namespace (``custom_task_in``), with the Tasks and the
    Pipeline below."""
    with custom_task_in(cluster, knative_deployment, USERS, gateway_s3.env) as installed:
        apply(cluster, user_resources(tekton.shell_image))
        yield installed


def user_resources(shell: str) -> list[dict]:
    meta = {"namespace": USERS}
    read = (
        'tr -d "\\n" < "$(workspaces.files.path)/repo/version" > "$(results.version.path)"\n'
        'tr -d "\\n" < "$(workspaces.files.path)/repo/sub/build.txt" > "$(results.build.path)"\n'
        '"$(workspaces.files.path)/repo/sub/run.sh" > "$(results.ran.path)"\n'
    )
    make = (
        'mkdir -p "$(workspaces.files.path)/out"\n'
        'printf "made-%s" "$(params.content)" > "$(workspaces.files.path)/out/version"\n'
    )
    return [
        {
            "apiVersion": "tekton.dev/v1",
            "kind": "Task",
            "metadata": {"name": "read-files", **meta},
            "spec": {
                "params": [{"name": "artifact"}, {"name": "store-url"}],
                "workspaces": [{"name": "files"}],
                "results": [{"name": "version"}, {"name": "build"}, {"name": "ran"}],
                "volumes": [{"name": "store", "secret": {"secretName": "store"}}],
                "steps": [
                    {
                        "name": "unpack",
                        "ref": {"name": "resource-functions-unpack"},
                        "params": [
                            {"name": "artifact", "value": "$(params.artifact)"},
                            {"name": "directory", "value": "$(workspaces.files.path)/repo"},
                            {"name": "store-url", "value": "$(params.store-url)"},
                            {"name": "store-credentials", "value": "store"},
                        ],
                    },
                    {"name": "read", "image": shell, "script": read},
                ],
            },
        },
        {
            "apiVersion": "tekton.dev/v1",
            "kind": "Task",
            "metadata": {"name": "make-output", **meta},
            "spec": {
                "params": [{"name": "content"}, {"name": "store-url"}],
                "workspaces": [{"name": "files"}],
                "results": [{"name": "artifact", "value": "$(steps.pack.results.artifact)"}],
                "volumes": [{"name": "store", "secret": {"secretName": "store"}}],
                "steps": [
                    {"name": "make", "image": shell, "script": make},
                    {
                        "name": "pack",
                        "ref": {"name": "resource-functions-pack"},
                        "params": [
                            {"name": "directory", "value": "$(workspaces.files.path)/out"},
                            {"name": "store-url", "value": "$(params.store-url)"},
                            {"name": "store-credentials", "value": "store"},
                            {"name": "team", "value": "$(context.taskRun.namespace)"},
                        ],
                    },
                ],
            },
        },
        {
            "apiVersion": "tekton.dev/v1",
            "kind": "Pipeline",
            "metadata": {"name": "fetch-and-read", **meta},
            "spec": {
                "params": [
                    {"name": "uri"},
                    {"name": "ref"},
                    {"name": "store-url"},
                    {"name": "get-params", "default": "{}"},
                ],
                "workspaces": [{"name": "files"}],
                "results": [
                    {"name": "version", "value": "$(tasks.read.results.version)"},
                    {"name": "build", "value": "$(tasks.read.results.build)"},
                    {"name": "ran", "value": "$(tasks.read.results.ran)"},
                ],
                "tasks": [
                    {
                        "name": "fetch",
                        "taskRef": {"apiVersion": API_VERSION, "kind": "Get"},
                        "params": [
                            {"name": "type", "value": "test"},
                            {"name": "source", "value": '{"uri": "$(params.uri)"}'},
                            {"name": "version", "value": '{"ref": "$(params.ref)"}'},
                            {"name": "params", "value": "$(params.get-params)"},
                        ],
                    },
                    {
                        "name": "read",
                        "runAfter": ["fetch"],
                        "taskRef": {"name": "read-files"},
                        "params": [
                            {"name": "artifact", "value": "$(tasks.fetch.results.artifact)"},
                            {"name": "store-url", "value": "$(params.store-url)"},
                        ],
                        "workspaces": [{"name": "files", "workspace": "files"}],
                    },
                    {
                        "name": "make",
                        "taskRef": {"name": "make-output"},
                        "params": [
                            {"name": "content", "value": "$(tasks.read.results.version)"},
                            {"name": "store-url", "value": "$(params.store-url)"},
                        ],
                        "workspaces": [{"name": "files", "workspace": "files"}],
                    },
                    {
                        "name": "push",
                        "taskRef": {"apiVersion": API_VERSION, "kind": "Put"},
                        "params": [
                            {"name": "type", "value": "test"},
                            {"name": "source", "value": '{"uri": "$(params.uri)"}'},
                            {"name": "params", "value": '{"input": "out"}'},
                            {
                                "name": "inputs",
                                "value": '{"out": $(tasks.make.results.artifact)}',
                            },
                        ],
                    },
                ],
            },
        },
    ]


def pipeline_run(name: str, store_url: str, ref: str, get_params: dict | None = None) -> dict:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": USERS},
        "spec": {
            "pipelineRef": {"name": "fetch-and-read"},
            "params": [
                {"name": "uri", "value": f"https://git.example/{name}"},
                {"name": "ref", "value": ref},
                {"name": "store-url", "value": store_url},
                {"name": "get-params", "value": json.dumps(get_params or {})},
            ],
            "workspaces": [{"name": "files", "emptyDir": {}}],
        },
    }


def custom_run(name: str, params: dict[str, str], **spec: object) -> dict:
    return {
        "apiVersion": "tekton.dev/v1beta1",
        "kind": "CustomRun",
        "metadata": {"name": name, "namespace": USERS},
        "spec": {
            "customRef": {"apiVersion": API_VERSION, "kind": "Get"},
            "params": [{"name": k, "value": v} for k, v in params.items()],
            **spec,
        },
    }


def get_params(name: str, extra: dict) -> dict[str, str]:
    return {
        "type": "test",
        "source": json.dumps({"uri": f"https://git.example/{name}"}),
        "version": json.dumps({"ref": "v1"}),
        "params": json.dumps(extra),
    }


def name_for(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def test_a_pipeline_gets_files_into_a_task_through_the_store(custom_task: CustomTask) -> None:
    name = name_for("fetch")
    apply(custom_task.cluster, [pipeline_run(name, custom_task.store_url, "c0ffee")])
    run = custom_task.finished("pipelinerun", name, timeout=300)
    fetched = custom_task.get("customrun", f"{name}-fetch")
    assert condition(run)["status"] == "True", (
        f"{condition(run)}\n{condition(fetched)}\n{custom_task.controller_logs()}"
    )
    found = {r["name"]: r["value"] for r in run["status"].get("results", [])}
    assert found["version"] == "c0ffee"
    assert found["build"] == f"build {fetched['metadata']['uid']} of fetch-and-read/fetch"
    assert found["ran"].strip() == "hi"  # its mode bit came through too
    got = results(fetched)
    assert json.loads(got["version"]) == {"ref": "c0ffee"}
    artifact = json.loads(got["artifact"])
    assert artifact["url"].startswith(custom_task.store_url + "/artifacts/")
    assert artifact["digest"].startswith("sha256:")
    assert condition(fetched)["reason"] == "Succeeded"
    pushed = custom_task.get("customrun", f"{name}-push")  # the pack StepAction's artifact
    assert json.loads(results(pushed)["version"]) == {"ref": "pushed-made-c0ffee"}
    claims = custom_task.cluster.kubectl("get", "pvc", "--all-namespaces", "-o", "name")
    assert claims.strip() == "", "no PersistentVolumeClaim anywhere"


def test_a_failing_get_fails_the_pipeline_run_readably(custom_task: CustomTask) -> None:
    name = name_for("fails")
    failing = {"mode": "fail", "password": PASSWORD}
    apply(custom_task.cluster, [pipeline_run(name, custom_task.store_url, "v1", failing)])
    run = custom_task.finished("pipelinerun", name, timeout=300)
    assert condition(run)["status"] == "False"
    assert condition(run)["reason"] == "Failed"
    fetched = custom_task.get("customrun", f"{name}-fetch")
    found = condition(fetched)
    assert (found["status"], found["reason"]) == ("False", "ResourceFailed")
    assert "cannot reach the repository" in found["message"]  # the log tail
    assert "resource_failed" in found["message"]
    # The params are the user's own, in the spec; what the controller writes is redacted.
    assert PASSWORD not in json.dumps(fetched["status"]) and "[redacted]" in found["message"]


def test_a_bad_param_fails_the_run_and_posts_nothing(custom_task: CustomTask) -> None:
    name = name_for("bad")
    params = {**get_params(name, {}), "version": "{not json"}
    apply(custom_task.cluster, [custom_run(name, params)])
    run = custom_task.finished("customrun", name, timeout=60)
    found = condition(run)
    assert (found["status"], found["reason"]) == ("False", "InvalidParams")
    assert "'version'" in found["message"] and "not valid JSON" in found["message"]
    uid = run["metadata"]["uid"]
    assert custom_task.deployment.sink.matching(id=uid) == []
    assert custom_task.jobs_of(uid) == []


def wait_job(custom_task: CustomTask, uid: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not custom_task.jobs_of(uid):
        if time.monotonic() > deadline:
            pytest.fail(f"no Job for request {uid}\n{custom_task.controller_logs()}")
        time.sleep(1)


def wait_no_job(custom_task: CustomTask, uid: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while jobs := custom_task.jobs_of(uid):
        if time.monotonic() > deadline:
            pytest.fail(f"Job of {uid} still there: {[j['metadata']['name'] for j in jobs]}")
        time.sleep(1)


def test_cancelling_a_running_get_stops_its_job(custom_task: CustomTask) -> None:
    name = name_for("cancel")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"delay": 300}))])
    running = custom_task.wait(
        "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
    )
    uid = running["metadata"]["uid"]
    wait_job(custom_task, uid)
    custom_task.cluster.kubectl(
        "-n",
        USERS,
        "patch",
        "customrun",
        name,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"status": "RunCancelled", "statusMessage": "stop it"}}),
    )
    run = custom_task.finished("customrun", name, timeout=60)
    found = condition(run)
    assert (found["status"], found["reason"], found["message"]) == (
        "False",
        "CustomRunCancelled",
        "stop it",
    )
    wait_no_job(custom_task, uid)


def test_a_get_past_its_timeout_times_out_and_its_job_stops(custom_task: CustomTask) -> None:
    name = name_for("timeout")
    apply(
        custom_task.cluster,
        [custom_run(name, get_params(name, {"delay": 300}), timeout="25s")],
    )
    running = custom_task.wait(
        "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
    )
    uid = running["metadata"]["uid"]
    wait_job(custom_task, uid)
    run = custom_task.finished("customrun", name, timeout=90)
    found = condition(run)
    assert (found["status"], found["reason"]) == ("False", "CustomRunTimedOut")
    wait_no_job(custom_task, uid)


def test_a_controller_killed_mid_run_reposts_and_the_script_runs_once(
    custom_task: CustomTask,
) -> None:
    name = name_for("restart")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"delay": 30}))])
    running = custom_task.wait(
        "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
    )
    uid = running["metadata"]["uid"]
    wait_job(custom_task, uid)
    custom_task.cluster.kubectl(
        "-n",
        NAMESPACE,
        "delete",
        "pod",
        "-l",
        "app.kubernetes.io/component=tekton-controller",
        "--force",
        "--grace-period=0",
    )
    custom_task.cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/tekton-controller", "--timeout=180s"
    )
    run = custom_task.finished("customrun", name, timeout=180)
    assert condition(run)["status"] == "True", condition(run)
    assert json.loads(results(run)["version"]) == {"ref": "v1"}
    posted = custom_task.deployment.sink.wait(count=2, id=uid, timeout=60)
    assert {e.get_attributes()["type"] for e in posted} == {"dev.resourcefunctions.get.requested"}
    (job,) = custom_task.jobs_of(uid)
    pods = json.loads(
        custom_task.cluster.kubectl(
            "-n",
            custom_task.deployment.tasks_namespace,
            "get",
            "pods",
            "-o",
            "json",
            "-l",
            f"job-name={job['metadata']['name']}",
        )
    )["items"]
    assert len(pods) == 1, "the script ran once"


# --- new versions start PipelineRuns: Broker -> channel (no reply) -> EventListener ----------

LISTENER = "new-versions"
EXAMPLES = Path(__file__).resolve().parents[2] / "knative" / "tekton" / "examples"
DISCOVERED = "dev.resourcefunctions.version.discovered"


def new_version_route(store_url: str) -> list[dict]:
    """``knative/tekton/examples/new-versions.yaml`` as a user adapts it: their namespace for
    tekton-main (so the check's subject becomes ``pipelines/<namespace>/app``), and their
    Pipeline in the TriggerTemplate (here fetch-and-read)."""
    text = (EXAMPLES / "new-versions.yaml").read_text().replace("tekton-main", USERS)
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if doc["kind"] == "TriggerTemplate":
            (run,) = doc["spec"]["resourcetemplates"]
            run["spec"] = {
                "pipelineRef": {"name": "fetch-and-read"},
                "params": [
                    {"name": "uri", "value": "https://git.example/new-versions"},
                    {"name": "ref", "value": "$(tt.params.ref)"},
                    {"name": "store-url", "value": store_url},
                ],
                "workspaces": [{"name": "files", "emptyDir": {}}],
            }
    return docs


def listener_logged(cluster: Cluster, texts: tuple[str, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        logs = cluster.kubectl("-n", USERS, "logs", f"deployment/el-{LISTENER}", check=False)
        if any(all(t in line for t in texts) for line in logs.splitlines()):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the listener logged no line with {texts}: {logs[-3000:]}")
        time.sleep(1)


def test_a_new_version_starts_one_pipeline_run_however_often_delivered(
    custom_task: CustomTask,
) -> None:
    import requests
    from cloudevents.core.bindings.http import to_binary_event
    from cloudevents.core.v1.event import CloudEvent

    cluster, deployment = custom_task.cluster, custom_task.deployment
    subject = f"pipelines/{USERS}/app"  # the example's Trigger, namespace adapted
    apply(cluster, new_version_route(custom_task.store_url))
    wait_ready(
        cluster,
        NAMESPACE,
        ["trigger/new-versions-to-tekton", "subscription/new-versions-to-tekton"],
    )
    wait_ready(cluster, USERS, [f"eventlistener/{LISTENER}"], timeout=180)
    event_id = str(uuid.uuid4())
    event = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": DISCOVERED,
            "source": "/resource-functions/check",
            "id": event_id,
            "subject": subject,
            "datacontenttype": "application/json",
        },
        data={"version": {"ref": "beef01"}, "resource": "0" * 64},
    )
    message = to_binary_event(event)
    for _ in range(2):  # a redelivery: the same event again
        answer = requests.post(
            deployment.broker, headers=dict(message.headers), data=message.body, timeout=30
        )
        assert answer.status_code == 202
    deployment.sink.wait(count=2, id=event_id, timeout=60)
    name = f"new-{event_id}"
    run = custom_task.finished("pipelinerun", name, timeout=300)
    assert condition(run)["status"] == "True", condition(run)
    found = {r["name"]: r["value"] for r in run["status"].get("results", [])}
    assert found["version"] == "beef01"
    listener_logged(cluster, ("already exists", name))
    runs = json.loads(
        cluster.kubectl(
            "-n",
            USERS,
            "get",
            "pipelinerun",
            "-o",
            "json",
            "-l",
            f"triggers.tekton.dev/eventlistener={LISTENER}",
        )
    )["items"]
    assert [r["metadata"]["name"] for r in runs] == [name]
    accepted = deployment.sink.matching(type="dev.tekton.event.triggers.accepted.v1")
    assert accepted == [], "the listener's answer must not reach the Broker"


def test_a_failing_get_is_retried_then_fails_with_its_attempts_in_retries_status(
    custom_task: CustomTask,
) -> None:
    name = name_for("retries")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"mode": "fail"}), retries=1)])
    run = custom_task.finished("customrun", name, timeout=180)
    found = condition(run)
    assert (found["status"], found["reason"]) == ("False", "ResourceFailed")
    (first,) = run["status"]["retriesStatus"]
    attempt = condition({"status": first})  # an entry is a status of its own
    assert attempt["status"] == "False"
    assert "cannot reach the repository" in attempt["message"]
    uid = run["metadata"]["uid"]
    assert run["status"]["extraFields"]["requestId"] == f"{uid}-r1"
    assert len(custom_task.jobs_of(uid)) == 1 and len(custom_task.jobs_of(f"{uid}-r1")) == 1
