"""The Tekton Custom Task on the real cluster (issues 29, 39), on the ``secured`` deployment:
``authentication-oidc`` on, ``knative/`` with the ``sender-auth`` and ``tekton`` components,
NetworkPolicies enforced, Tekton installed; the StepActions of ``knative/tekton/steps/`` in a
user namespace an administrator labelled as its team. No store credential is in any pipeline
namespace at any time (polled each second while the module runs).

- A Pipeline whose first task is a ``Get`` CustomRun (the test resource image) and whose
  second is a Task that unpacks the Get's ``artifact`` into an emptyDir workspace (the
  ``resource-functions-unpack`` StepAction, through the artifacts service with its pod's
  token) and reads the files; a third Task writes a directory and packs it
  (``resource-functions-pack``), and a ``Put`` CustomRun takes that artifact as its input: the
  PipelineRun succeeds with what the files say, the put saw the packed file; no
  PersistentVolumeClaim exists anywhere.
- A Task of another team given that Get's artifact: its unpack step gets 403, reads nothing.
- A forged reply: another team's request carrying the CustomRun's subject and its very request
  id is run and answered for that team; the controller drops the answer, and the CustomRun
  ends with its own get's result.
- The controller may write the status of this project's CustomRuns only, and only a team
  administrator may label a namespace as a team (the component's admission policies).
- A failing get: the PipelineRun fails; its CustomRun is ``False`` with the failure kind as
  reason and the resource's (redacted) log tail in the message.
- A controller killed mid-run: the restarted controller posts the same request again (the
  Broker's sink sees the event id twice), the functions attach it to the run under way (one
  Job, one pod), and the CustomRun completes.
- New versions start PipelineRuns (``knative/tekton/examples/``): a ``version.discovered``
  event posted into the Broker twice (a redelivery) starts one PipelineRun, named after the
  event, which succeeds; the EventListener's CloudEvent answer never reaches the Broker.
- A bad param: ``False``, ``InvalidParams``, the message naming the param; no request posted
  (the Broker's sink never sees one for it) and no Job.
- Cancelling a running get (``spec.status: RunCancelled``): ``CustomRunCancelled``, and its
  Job is deleted.
- A failing get with ``retries: 1``: two attempts (two Jobs, each with its own request id),
  the first in ``retriesStatus``, then ``False``.
- A get past its ``spec.timeout``: ``CustomRunTimedOut``, and its Job is deleted.
- The artifacts service under a hundred slow clients (heads a byte at a time): the Pipeline's
  unpack and pack are served, each slow one gets 408; a team's 121st upload of the hour is 429,
  another team's next one 201 (issue 50).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply
from tests.cluster.conftest import NAMESPACE, wait_ready
from tests.cluster.custom_task import (
    TEAM_LABEL,
    TOKEN_VOLUME,
    CustomTask,
    NoStoreKeys,
    condition,
    custom_task_in,
    request_id,
    results,
)
from tests.cluster.probes import reachable_from, run_pod
from tests.cluster.secured import PIPELINE_TEAMS, Secured, identity
from tests.cluster.timeline import audit_entries
from tests.support import tekton_pipelines as pipelines
from tests.support.slow_clients import Trickle
from tests.support.tekton_pipelines import custom_task_ref, task_run, tekton_object

REPO = Path(__file__).resolve().parents[2]
USERS = PIPELINE_TEAMS[0]  # a Tekton user's namespace, labelled as its team "tekton-ct"
OTHERS = "tekton-other"  # another team's namespace (no CustomRun: only a Task)
TEKTON_NAMESPACES = (USERS, OTHERS)  # shown by conftest when a test fails
PASSWORD = "tekton-canary-7f3a"  # in a get's params: must never show in a status


@pytest.fixture(scope="module")
def custom_task(cluster: Cluster, secured: Secured, tekton) -> Iterator[CustomTask]:
    """The user namespaces (``custom_task_in``), with the Tasks and the Pipeline below; no
    Secret holding a store key in either while the module runs (checked after it)."""
    with (
        NoStoreKeys(cluster, secured.deployment.s3.keys, TEKTON_NAMESPACES) as keys,
        custom_task_in(cluster, secured, USERS) as installed,
        custom_task_in(cluster, secured, OTHERS),
    ):
        apply(cluster, user_resources(tekton.shell_image))
        apply(cluster, [reader_task(OTHERS, tekton.shell_image)])
        yield installed
    assert keys.polls > 10 and keys.found == {}, keys.found


def user_resources(shell: str) -> list[dict]:
    make = (
        'mkdir -p "$(workspaces.files.path)/out"\n'
        'printf "made-%s" "$(params.content)" > "$(workspaces.files.path)/out/version"\n'
    )
    return [
        reader_task(USERS, shell),
        tekton_object(
            "Task",
            "make-output",
            USERS,
            {
                "params": [{"name": "content"}],
                "workspaces": [{"name": "files"}],
                "results": [{"name": "artifact", "value": "$(steps.pack.results.artifact)"}],
                "volumes": [TOKEN_VOLUME],
                "steps": [
                    {"name": "make", "image": shell, "script": make},
                    {
                        "name": "pack",
                        "ref": {"name": "resource-functions-pack"},
                        "params": [
                            {"name": "directory", "value": "$(workspaces.files.path)/out"},
                        ],
                    },
                ],
            },
        ),
        tekton_object(
            "Pipeline",
            "fetch-and-read",
            USERS,
            {
                "params": [
                    {"name": "uri"},
                    {"name": "ref"},
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
                        "taskRef": custom_task_ref("Get"),
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
                        ],
                        "workspaces": [{"name": "files", "workspace": "files"}],
                    },
                    {
                        "name": "make",
                        "taskRef": {"name": "make-output"},
                        "params": [
                            {"name": "content", "value": "$(tasks.read.results.version)"},
                        ],
                        "workspaces": [{"name": "files", "workspace": "files"}],
                    },
                    {
                        "name": "push",
                        "taskRef": custom_task_ref("Put"),
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
        ),
    ]


def reader_task(namespace: str, shell: str) -> dict:
    """A Task that unpacks a Get's artifact with its pod's token and reads the files."""
    read = (
        'tr -d "\\n" < "$(workspaces.files.path)/repo/version" > "$(results.version.path)"\n'
        'tr -d "\\n" < "$(workspaces.files.path)/repo/sub/build.txt" > "$(results.build.path)"\n'
        '"$(workspaces.files.path)/repo/sub/run.sh" > "$(results.ran.path)"\n'
    )
    return tekton_object(
        "Task",
        "read-files",
        namespace,
        {
            "params": [{"name": "artifact"}],
            "workspaces": [{"name": "files"}],
            "results": [{"name": "version"}, {"name": "build"}, {"name": "ran"}],
            "volumes": [TOKEN_VOLUME],
            "steps": [
                {
                    "name": "unpack",
                    "ref": {"name": "resource-functions-unpack"},
                    "params": [
                        {"name": "artifact", "value": "$(params.artifact)"},
                        {"name": "directory", "value": "$(workspaces.files.path)/repo"},
                    ],
                },
                {"name": "read", "image": shell, "script": read},
            ],
        },
    )


def pipeline_run(name: str, ref: str, get_params: dict | None = None) -> dict:
    values = {
        "uri": f"https://git.example/{name}",
        "ref": ref,
        "get-params": json.dumps(get_params or {}),
    }
    files = [{"name": "files", "emptyDir": {}}]
    return pipelines.pipeline_run(name, USERS, "fetch-and-read", values, files)


def custom_run(name: str, params: dict[str, str], **spec: object) -> dict:
    return pipelines.custom_run(name, USERS, params, **spec)


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
    apply(custom_task.cluster, [pipeline_run(name, "c0ffee")])
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


def fetched_artifact(custom_task: CustomTask, name: str) -> str:
    """The ``artifact`` result of a Get CustomRun of the user's team."""
    apply(custom_task.cluster, [custom_run(name, get_params(name, {}))])
    run = custom_task.finished("customrun", name, timeout=180)
    assert condition(run)["status"] == "True", (condition(run), custom_task.controller_logs())
    return results(run)["artifact"]


def test_a_task_of_another_team_gets_403_for_the_artifact_and_reads_nothing(
    custom_task: CustomTask,
) -> None:
    artifact = fetched_artifact(custom_task, name_for("theirs"))
    name = name_for("steal")
    files = [{"name": "files", "emptyDir": {}}]
    stealing = task_run(name, OTHERS, "read-files", {"artifact": artifact}, workspaces=files)
    apply(custom_task.cluster, [stealing])
    others = CustomTask(custom_task.cluster, custom_task.deployment, "", OTHERS)
    run = others.finished("taskrun", name, timeout=240)
    assert condition(run)["status"] == "False"
    said = custom_task.cluster.kubectl(
        "-n", OTHERS, "logs", run["status"]["podName"], "-c", "step-unpack", check=False
    )
    assert "403" in said and f"not an artifact of team '{OTHERS}'" in said, said
    served = custom_task.cluster.kubectl(
        "-n", NAMESPACE, "logs", "-l", "app.kubernetes.io/component=tekton-artifacts", "--tail=-1"
    )
    fetched_by_them = [
        line for line in served.splitlines() if "artifact fetched" in line and OTHERS in line
    ]
    assert fetched_by_them == [], "not one byte of it went to the other team"
    assert "artifact fetched" in served  # the team's own Task read it (the pipeline test)


def test_another_teams_request_with_a_runs_subject_and_request_id_changes_nothing(
    custom_task: CustomTask, secured: Secured
) -> None:
    """Even knowing the CustomRun's request id, team main's engine cannot complete it: its
    request runs for team main, the reply says so, and the controller drops it."""
    from tests.support.events import request_event

    name = name_for("victim")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"delay": 25}))])
    running = custom_task.wait("customrun", name, lambda o: bool(request_id(o)), timeout=60)
    rid = request_id(running)
    build = {"id": "1", "name": "1", "job": "x", "pipeline": "p", "team": "main"}
    forged = request_event(
        "get",
        {
            "type": "test",
            "source": {"uri": "https://evil.example"},
            "version": {"ref": "evil"},
            "build": build,
        },
        event_id=rid,
        source="/resource-functions/tekton-controller",
        subject=f"tekton.dev/customruns/{USERS}/{name}",
        team="main",
    )
    assert secured.post(forged) == 202
    (reply,) = custom_task.deployment.sink.wait(
        requestid=rid, type="dev.resourcefunctions.get.succeeded", team="main", timeout=120
    )
    assert reply.get_data()["version"] == {"ref": "evil"}
    assert condition(custom_task.get("customrun", name))["status"] == "Unknown"
    run = custom_task.finished("customrun", name, timeout=180)
    assert condition(run)["status"] == "True", condition(run)
    assert json.loads(results(run)["version"]) == {"ref": "v1"}
    events = json.loads(
        custom_task.cluster.kubectl(
            "-n",
            USERS,
            "get",
            "events",
            "-o",
            "json",
            "--field-selector",
            f"involvedObject.name={name},reason=ReplyDropped",
        )
    )["items"]
    assert events and "team 'main'" in events[0]["message"], events


def test_the_controller_writes_the_status_of_this_projects_customruns_only(
    custom_task: CustomTask, tmp_path: Path
) -> None:
    cluster = custom_task.cluster
    name = name_for("foreign")
    foreign = custom_run(name, {})
    foreign["spec"]["customRef"] = {"apiVersion": "example.dev/v1", "kind": "Wait"}
    apply(cluster, [foreign])
    kubeconfig = cluster.token_kubeconfig(tmp_path / "controller", NAMESPACE, "tekton-controller")
    done_at = "2026-12-04T00:00:00Z"
    succeeded = {
        "type": "Succeeded",
        "status": "True",
        "reason": "X",
        "lastTransitionTime": done_at,
    }
    status = {"status": {"conditions": [succeeded]}}
    done = cluster.run_kubectl(
        f"--kubeconfig={kubeconfig}",
        "-n",
        USERS,
        "patch",
        "customrun",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    assert done.returncode != 0
    assert "writes the status of resource-functions.dev CustomRuns only" in done.stderr


def test_only_a_team_administrator_labels_a_namespace_as_a_team(
    custom_task: CustomTask, tmp_path: Path
) -> None:
    """Whoever may create namespaces may not make one a team: the admission policy, through
    the namespace's status subresource too (issue 50)."""
    cluster = custom_task.cluster
    maker = "namespace-maker"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": maker},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["namespaces", "namespaces/status"],
                "verbs": ["create", "get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": maker},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": maker},
        "subjects": [{"kind": "ServiceAccount", "name": maker, "namespace": NAMESPACE}],
    }
    cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", maker, check=False)
    apply(cluster, [role, binding])
    kubeconfig = cluster.token_kubeconfig(tmp_path / "maker", NAMESPACE, maker)
    name = name_for("posing")
    labelled = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"resource-functions.dev/team": USERS}},
    }
    as_maker = (f"--kubeconfig={kubeconfig}", "create", "-f", "-")
    done = cluster.run_kubectl(*as_maker, stdin=json.dumps(labelled))
    assert done.returncode != 0 and "only team administrators" in done.stderr, done.stderr
    plain = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    assert cluster.run_kubectl(*as_maker, stdin=json.dumps(plain)).returncode == 0
    relabel = json.dumps({"metadata": {"labels": {"resource-functions.dev/team": USERS}}})
    done = cluster.run_kubectl(
        f"--kubeconfig={kubeconfig}", "patch", "namespace", name, "-p", relabel
    )
    assert done.returncode != 0 and "only team administrators" in done.stderr, done.stderr
    done = cluster.run_kubectl(
        f"--kubeconfig={kubeconfig}",
        "patch",
        "namespace",
        name,
        "--subresource=status",
        "-p",
        relabel,
    )
    assert done.returncode != 0 and "only team administrators" in done.stderr, done.stderr
    labels = cluster.kubectl("get", "namespace", name, "-o", "jsonpath={.metadata.labels}")
    assert "resource-functions.dev/team" not in labels
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_a_failing_get_fails_the_pipeline_run_readably(custom_task: CustomTask) -> None:
    name = name_for("fails")
    failing = {"mode": "fail", "password": PASSWORD}
    apply(custom_task.cluster, [pipeline_run(name, "v1", failing)])
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
    assert request_id(run) == ""  # none was made, so none was posted
    subject = f"tekton.dev/customruns/{USERS}/{name}"
    assert custom_task.deployment.sink.matching(subject=subject) == []


def wait_job(custom_task: CustomTask, request: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not custom_task.jobs_of(request):
        if time.monotonic() > deadline:
            pytest.fail(f"no Job for request {request}\n{custom_task.controller_logs()}")
        time.sleep(1)


def wait_no_job(custom_task: CustomTask, request: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while jobs := custom_task.jobs_of(request):
        if time.monotonic() > deadline:
            pytest.fail(f"Job of {request} still there: {[j['metadata']['name'] for j in jobs]}")
        time.sleep(1)


def test_cancelling_a_running_get_stops_its_job(custom_task: CustomTask) -> None:
    name = name_for("cancel")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"delay": 300}))])
    running = custom_task.wait(
        "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
    )
    uid = request_id(running)
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
    uid = request_id(running)
    wait_job(custom_task, uid)
    run = custom_task.finished("customrun", name, timeout=90)
    found = condition(run)
    assert (found["status"], found["reason"]) == ("False", "CustomRunTimedOut")
    wait_no_job(custom_task, uid)


def test_a_cancel_before_the_job_exists_means_no_job_ever_and_no_reply(
    custom_task: CustomTask,
) -> None:
    """The request is held in the Broker's retries (the functions may not create Jobs for a
    moment: their RoleBinding is away, so each delivery is a 503), the run is cancelled
    meanwhile, and the functions' right comes back: the retried request finds its run
    stopped, so no Job is ever created for it and no reply is posted."""
    cluster, tasks = custom_task.cluster, custom_task.deployment.tasks_namespace
    binding = json.loads(
        cluster.kubectl("-n", tasks, "get", "rolebinding", "resource-functions-tasks", "-o", "json")
    )
    for field in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
        binding["metadata"].pop(field, None)
    offset = cluster.audit_log.stat().st_size
    cluster.kubectl("-n", tasks, "delete", "rolebinding", "resource-functions-tasks")
    try:
        name = name_for("early")
        apply(cluster, [custom_run(name, get_params(name, {"delay": 1}))])
        running = custom_task.wait(
            "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
        )
        request = request_id(running)
        deadline = time.monotonic() + 60
        while not job_creates(cluster, offset, 403):
            assert time.monotonic() < deadline, "the request never reached the get function"
            time.sleep(0.5)
        cluster.kubectl(
            "-n", USERS, "patch", "customrun", name, "--type", "merge",
            "-p", json.dumps({"spec": {"status": "RunCancelled"}}),
        )  # fmt: skip
        found = condition(custom_task.finished("customrun", name, timeout=60))
        assert (found["status"], found["reason"]) == ("False", "CustomRunCancelled")
        time.sleep(3)  # the stop delivered: marked before its own Job deletion is refused
    finally:
        apply(cluster, [binding])
    line = f'"id": "{request}"'
    deadline = time.monotonic() + 180  # the Broker's next retries: 14, 30, 62, 126 s
    while not [
        entry
        for entry in function_logs(custom_task, "get").splitlines()
        if "stopped before it ran" in entry and line in entry.replace('":"', '": "')
    ]:
        assert time.monotonic() < deadline, f"request {request} was not retried into its stop"
        time.sleep(2)
    assert job_creates(cluster, offset, 201) == [] and custom_task.jobs_of(request) == []
    # No reply was posted: the sink takes every event the Broker takes (a reply would have
    # reached the controller's Trigger too, which drops one for a finished run unlogged).
    time.sleep(5)
    replies = custom_task.deployment.sink.matching(requestid=request)
    assert replies == [], [e.get_attributes() for e in replies]
    assert condition(custom_task.get("customrun", name))["reason"] == "CustomRunCancelled"


def job_creates(cluster: Cluster, offset: int, code: int) -> list[dict]:
    """The functions' creates of Jobs the API server answered with ``code`` since byte
    ``offset`` of its audit log (which records the functions' requests only); of a created
    one, the get function's (a refused one names no object: refused before it was read)."""
    return [
        e
        for e in audit_entries(cluster.audit_log, offset)
        if e.get("verb") == "create"
        and (e.get("objectRef") or {}).get("resource") == "jobs"
        and (e.get("responseStatus") or {}).get("code") == code
        and (code != 201 or str(e["objectRef"].get("name")).startswith("rf-get-"))
    ]


def function_logs(custom_task: CustomTask, service: str) -> str:
    return custom_task.cluster.kubectl(
        "-n", NAMESPACE, "logs", "-l", f"serving.knative.dev/service={service}",
        "-c", "function", "--tail=-1", check=False,
    )  # fmt: skip


def leader_pod(custom_task: CustomTask) -> str:
    lease = json.loads(
        custom_task.cluster.kubectl(
            "-n", NAMESPACE, "get", "lease", "tekton-controller", "-o", "json"
        )
    )
    return str(lease["spec"]["holderIdentity"])


def test_the_leader_killed_mid_run_the_other_replica_takes_over_and_the_script_runs_once(
    custom_task: CustomTask,
) -> None:
    """Two replicas elect a leader on the Lease; killed (no grace), its Lease runs out and the
    other takes it, lists, posts the running attempt's request again (the Broker's sink sees
    its id twice), and the functions attach it to the run under way: one Job, one pod."""
    name = name_for("restart")
    apply(custom_task.cluster, [custom_run(name, get_params(name, {"delay": 30}))])
    running = custom_task.wait(
        "customrun", name, lambda o: condition(o).get("status") == "Unknown", timeout=60
    )
    uid = request_id(running)
    wait_job(custom_task, uid)
    killed = leader_pod(custom_task)
    custom_task.cluster.kubectl(
        "-n", NAMESPACE, "delete", "pod", killed, "--force", "--grace-period=0"
    )
    run = custom_task.finished("customrun", name, timeout=180)
    assert condition(run)["status"] == "True", condition(run)
    assert json.loads(results(run)["version"]) == {"ref": "v1"}
    posted = custom_task.deployment.sink.wait(count=2, id=uid, timeout=60)
    assert {e.get_attributes()["type"] for e in posted} == {"dev.resourcefunctions.get.requested"}
    assert leader_pod(custom_task) != killed
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
    custom_task.cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/tekton-controller", "--timeout=180s"
    )


def test_a_request_the_functions_refuse_ends_its_customrun_within_30_seconds(
    custom_task: CustomTask,
) -> None:
    """Refused after it was posted (its data is fine, its ((var)) is not there, or its input is
    no artifact of the team): the function answers the Broker 400 or 403 and posts a failed
    reply, which ends the CustomRun at once rather than at its timeout."""
    cluster = custom_task.cluster
    team_namespace = f"concourse-{USERS}"  # its credentials, bound as knative/teams/ binds them
    apply(
        cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team_namespace}}]
    )
    binding = yaml.safe_load((REPO / "knative" / "teams" / "rolebinding.yaml").read_text())
    binding["metadata"]["namespace"] = team_namespace
    apply(cluster, [binding])
    nope = name_for("nope")
    params = {**get_params(nope, {}), "source": json.dumps({"token": "((not-there))"})}
    elsewhere = name_for("elsewhere")
    put = custom_run(
        elsewhere,
        {
            "type": "test",
            "source": json.dumps({"uri": "https://git.example/x"}),
            "inputs": json.dumps(
                {
                    "repo": {
                        "url": f"{custom_task.store_url}/artifacts/inputs/theirs.tar.zst",
                        "digest": "sha256:" + "0" * 64,
                    }
                }
            ),
        },
    )
    put["spec"]["customRef"]["kind"] = "Put"
    started = time.monotonic()
    apply(cluster, [custom_run(nope, params), put])
    for name, said in ((nope, "not-there"), (elsewhere, "not an artifact of team")):
        run = custom_task.finished("customrun", name, timeout=30 - (time.monotonic() - started))
        found = condition(run)
        assert (found["status"], found["reason"]) == ("False", "InvalidRequest"), found
        assert said in found["message"], found["message"]
    assert time.monotonic() - started < 30


def test_an_image_the_functions_do_not_allow_is_refused_before_it_is_posted(
    custom_task: CustomTask,
) -> None:
    name = name_for("image")
    params = {**get_params(name, {}), "image": "registry.example/anything:1"}
    del params["type"]
    apply(custom_task.cluster, [custom_run(name, params)])
    run = custom_task.finished("customrun", name, timeout=60)
    found = condition(run)
    assert (found["status"], found["reason"]) == ("False", "InvalidParams")
    assert "ALLOWED_IMAGES" in found["message"] and request_id(run) == ""


# --- new versions start PipelineRuns: Broker -> channel (no reply) -> EventListener ----------

LISTENER = "new-versions"
EXAMPLES = Path(__file__).resolve().parents[2] / "knative" / "tekton" / "examples"
DISCOVERED = "dev.resourcefunctions.version.discovered"


def new_version_route() -> list[dict]:
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
    custom_task: CustomTask, secured: Secured
) -> None:
    """The discovered event is posted as the functions post theirs (their SinkBinding's
    identity, which the Broker's policy admits for discovered versions)."""
    from cloudevents.core.v1.event import CloudEvent

    cluster, deployment = custom_task.cluster, custom_task.deployment
    subject = f"pipelines/{USERS}/app"  # the example's Trigger, namespace adapted
    apply(cluster, new_version_route())
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
            "team": USERS,
        },
        data={"version": {"ref": "beef01"}, "resource": "0" * 64},
    )
    functions = identity("function-replies", "sinkbinding").rpartition(":")[2]
    for _ in range(2):  # a redelivery: the same event again
        assert secured.post(event, functions, NAMESPACE) == 202
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
    ids = [request_id({"status": first}), request_id(run)]
    assert all(ids) and ids[0] != ids[1] and run["metadata"]["uid"] not in ids
    assert [len(custom_task.jobs_of(i)) for i in ids] == [1, 1]


# --- the controller under load (a benchmark: smoke size in CI) --------------------------------


def controller_metric(custom_task: CustomTask, name: str) -> float:
    """A metric summed over the controller's replicas (their /metrics, through the API)."""
    pods = custom_task.cluster.kubectl(
        "-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=tekton-controller",
        "-o", "jsonpath={.items[*].metadata.name}",
    ).split()  # fmt: skip
    total = 0.0
    for pod in pods:
        text = custom_task.cluster.kubectl(
            "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/metrics",
            check=False,
        )  # fmt: skip
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + " ", name + "{"))
        )
    return total


@pytest.mark.bench
@pytest.mark.timeout(1800)
def test_figures_many_customruns_at_once_one_poisoned(custom_task: CustomTask, capsys) -> None:
    """Cached gets across the load namespaces, created at once, with one CustomRun whose
    param is nested 5,000 levels deep among them: every healthy one succeeds; time to all
    Succeeded, p50/p95 creation → Succeeded, API requests per CustomRun. RF_CT_LOAD_RUNS
    (500 / 20) over RF_CT_LOAD_NAMESPACES (10 / 2)."""
    from tests.cluster.secured import LOAD_TEAMS
    from tests.support.bench import size

    total, spaces = size("RF_CT_LOAD_RUNS", 500, 20), size("RF_CT_LOAD_NAMESPACES", 10, 2)
    namespaces = LOAD_TEAMS[:spaces]
    cluster = custom_task.cluster
    labelled = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {TEAM_LABEL: ns}},
        }
        for ns in namespaces
    ]
    apply(cluster, labelled)
    source = json.dumps({"uri": f"https://git.example/load-{uuid.uuid4().hex[:6]}"})
    warm = name_for("warm")  # the one Job: every other get of this version is a cache hit
    warm_run = custom_run(warm, {**get_params(warm, {}), "source": source})
    warm_run["metadata"]["namespace"] = namespaces[0]
    apply(cluster, [warm_run])
    CustomTask(cluster, custom_task.deployment, "", namespaces[0]).finished("customrun", warm)
    requests_before = controller_metric(custom_task, "resource_functions_tekton_api_requests_total")
    runs = []
    for n in range(total):
        name = f"load-{n:04d}"
        run = custom_run(name, {**get_params(name, {}), "source": source})
        run["metadata"]["namespace"] = namespaces[n % spaces]
        runs.append(run)
    poisoned = custom_run("poisoned", {**get_params("poisoned", {}), "source": "[" * 5000})
    poisoned["metadata"]["namespace"] = namespaces[0]
    started = time.monotonic()
    apply(cluster, [poisoned, *runs])
    done: dict[tuple[str, str], float] = {}
    while len(done) < total:
        assert time.monotonic() - started < 1500, f"{len(done)} of {total} done"
        for ns in namespaces:
            listed = json.loads(cluster.kubectl("-n", ns, "get", "customruns", "-o", "json"))
            for item in listed["items"]:
                key = (ns, item["metadata"]["name"])
                if (
                    key[1].startswith("load-")
                    and key not in done
                    and condition(item).get("status") == "True"
                ):
                    done[key] = time.monotonic() - started
        time.sleep(0.5)
    wall = time.monotonic() - started
    requests = controller_metric(custom_task, "resource_functions_tekton_api_requests_total")
    poison = CustomTask(cluster, custom_task.deployment, "", namespaces[0]).get(
        "customrun", "poisoned"
    )
    assert condition(poison).get("reason") == "InvalidParams"
    times = sorted(done.values())
    p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95) - 1]
    per_run = (requests - requests_before) / (total + 1)
    with capsys.disabled():
        print(
            f"\n[tekton] {total} cached gets in {spaces} namespaces + 1 poisoned, created at once: "
            f"all Succeeded in {wall:.1f} s; creation -> Succeeded p50 {p50:.1f} s, p95 {p95:.1f} s "
            f"(p95/p50 {p95 / p50:.2f}); controller API requests per CustomRun {per_run:.2f}"
        )
    for ns in namespaces:
        cluster.kubectl("-n", ns, "delete", "customruns", "--all", "--wait=false", check=False)


def test_a_pipeline_namespaces_pods_reach_the_artifacts_service_not_the_broker_or_listener(
    custom_task: CustomTask, cluster_images: dict[str, str]
) -> None:
    """The component's NetworkPolicies, enforced: a pod of a team's namespace (a Task step)
    reaches the artifacts service (the control: the probe works), and neither Knative
    Eventing's receivers nor the new-versions EventListener (applied by the test above)."""
    artifacts = f"http://tekton-artifacts.{NAMESPACE}.svc.cluster.local/healthz"
    ingress = f"http://broker-ingress.knative-eventing.svc.cluster.local/{NAMESPACE}/default"
    listener = f"http://el-{LISTENER}.{USERS}.svc.cluster.local:8080/"
    found, said = reachable_from(
        custom_task.cluster, USERS, cluster_images["task"], [artifacts, ingress, listener]
    )
    assert found == {artifacts: True, ingress: False, listener: False}, said


def artifacts_address(cluster: Cluster) -> str:
    """``http://<cluster IP>`` of the artifacts service, as this machine reaches it."""
    ip = cluster.kubectl(
        "-n", NAMESPACE, "get", "service", "tekton-artifacts", "-o", "jsonpath={.spec.clusterIP}"
    ).strip()
    return f"http://{ip}:80"


def test_a_pipeline_unpacks_and_packs_while_a_hundred_slow_clients_trickle(
    custom_task: CustomTask, capsys
) -> None:
    """Issue 50: a hundred connections sending their heads a byte at a time (no token needed
    to be slow) held every thread of the artifacts service; now its event loop holds them,
    the Pipeline's unpack and pack steps are served meanwhile, and each slow one gets 408."""
    trickle = Trickle(
        artifacts_address(custom_task.cluster),
        100,
        b"GET /artifacts?url=",
        b"x" * 200,
        0.2,
    )
    try:
        name = name_for("slow")
        started = time.monotonic()
        apply(custom_task.cluster, [pipeline_run(name, "5l0w")])
        run = custom_task.finished("pipelinerun", name, timeout=300)
        took = time.monotonic() - started
        answers = trickle.answers(timeout=30)
    finally:
        trickle.close()
    assert condition(run)["status"] == "True", condition(run)
    assert answers == [b"HTTP/1.1 408 Request Timeout"] * 100, set(answers)
    with capsys.disabled():
        print(f"\n[tekton] the Pipeline (unpack, pack) beside 100 slow clients: {took:.1f} s")


UPLOADS = """
import json, sys, urllib.error, urllib.request
token = open("/token/token").read().strip()
found = []
for _ in range(int(sys.argv[2])):
    request = urllib.request.Request(
        sys.argv[1] + "/artifacts?format=none", data=b"\\0" * 1024, method="POST",
        headers={"Authorization": "Bearer " + token},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            found.append([answer.status, ""])
    except urllib.error.HTTPError as err:
        found.append([err.code, err.headers.get("Retry-After", "")])
print(json.dumps(found))
"""


def uploads_from(cluster: Cluster, namespace: str, image: str, count: int) -> list[list]:
    """``count`` empty uploads (a tar's end) from a pod of ``namespace`` with its projected
    token: each one's status and Retry-After."""
    url = f"http://tekton-artifacts.{NAMESPACE}.svc.cluster.local"
    said = run_pod(
        cluster,
        namespace,
        image,
        ["python", "-c", UPLOADS, url, str(count)],
        volumes=[TOKEN_VOLUME],
        mounts=[{"name": TOKEN_VOLUME["name"], "mountPath": "/token"}],
    )
    return json.loads(said.strip().splitlines()[-1])


def test_a_team_past_its_upload_quota_gets_429_and_another_team_does_not(
    custom_task: CustomTask, secured: Secured, cluster_images: dict[str, str]
) -> None:
    """Issue 50: uploads had no quota. A team's 121st upload of the hour (the shipped
    ARTIFACT_UPLOADS_PER_HOUR: 120) is 429 with the seconds left of the hour, counted in the
    store; another team's next upload is 201."""
    from tests.cluster.secured import LOAD_TEAMS

    cluster = custom_task.cluster
    with custom_task_in(cluster, secured, LOAD_TEAMS[-3]):
        found = uploads_from(cluster, LOAD_TEAMS[-3], cluster_images["task"], 122)
    assert [status for status, _ in found[:120]] == [201] * 120, found[:120]
    assert [status for status, _ in found[120:]] == [429, 429], found[120:]
    assert 1 <= int(found[-1][1]) <= 3600
    assert uploads_from(cluster, USERS, cluster_images["task"], 1) == [[201, ""]]
