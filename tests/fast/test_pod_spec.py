"""The task Job and its stdin Secret, checked as data against the official schemas, and the
fixed resource-step script run for real by a shell (busybox, in a chroot)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from functions import protocol
from functions.model import Build, HistoryPlan, ResourceType, TraceContext
from functions.runtimes import labels
from functions.runtimes.kube import job_plan, podspec
from functions.runtimes.kube.job_plan import JobPlan, KubernetesConfig, plan_for
from functions.runtimes.kube.name_files import NameFiles
from functions.runtimes.kube.podspec import (
    RESOURCE_SCRIPT,
    job_manifest,
    stdin_secret_manifest,
)
from functions.steps import pod_contract
from functions.steps.pod_contract import CollectStep, StageStep, parse_input
from tests.support.job_plans import CANARY, CONFIG, DIGEST, STORE_URL, make_plan, make_task

VERSIONS = ("1.30", "1.37")
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OWNER_UID = "0b6a4bd7-1f6c-4d9e-9f0e-3a1c2b3d4e5f"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    """The Pod the Job controller would create from the template."""
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"] + "-x7k2p", **template["metadata"]},
        "spec": template["spec"],
    }


def containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


ACTIONS = ("check", "get", "put")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("reply", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("action", ACTIONS)
def test_manifests_validate_strictly(action: str, reply: bool, version: str) -> None:
    plan = make_plan(action, reply=reply)
    task = make_task(action)
    job = job_manifest(plan)
    for obj in (job, pod_of(job), stdin_secret_manifest(plan, task.stdin, OWNER_UID)):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("action", ACTIONS)
def test_job_runs_once_within_its_deadline_and_is_cleaned_up(action: str) -> None:
    spec = job_manifest(make_plan(action))["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 1800 + 300
    assert spec["ttlSecondsAfterFinished"] == 600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 5
    assert pod["serviceAccountName"] == "resource-task"
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


def test_deadline_rounds_up_fractional_timeouts() -> None:
    plan = make_plan()
    assert (
        JobPlan(
            **{**plan.__dict__, "timeout_seconds": 0.2, "margin_seconds": 1}
        ).active_deadline_seconds
        == 2
    )


@pytest.mark.parametrize(
    ("action", "order"),
    [
        ("check", ["resource", "collect"]),
        ("get", ["resource", "collect"]),
        ("put", ["stage", "resource", "collect"]),
    ],
)
def test_steps_run_in_order_around_the_resource(action: str, order: list[str]) -> None:
    pod = job_manifest(make_plan(action))["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == order[:-1]
    assert [c["name"] for c in pod["containers"]] == ["collect"]


@pytest.mark.parametrize("action", ACTIONS)
def test_build_dir_is_shared_and_stdin_reaches_only_resource_and_collect(action: str) -> None:
    job = job_manifest(make_plan(action))
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["build"] == {"name": "build", "emptyDir": {"sizeLimit": "8Gi"}}
    assert volumes["stdin"]["secret"] == {
        "secretName": job_plan.job_name(action, make_task(action).run_id) + "-stdin",
        "optional": False,
        "defaultMode": 0o400,
        "items": [
            {"key": "stdin", "path": "stdin"},
            {"key": "redact", "path": "redact"},
            {"key": "resolved", "path": "resolved"},
        ],
    }
    for name, container in containers(job).items():
        assert mounts(container)["build"] == "/tmp/build"
        assert ("stdin" in mounts(container)) == (name in ("resource", "collect")), name


def test_nothing_from_stdin_reaches_the_job() -> None:
    for action in ACTIONS:
        for reply in (False, True):
            job = json.dumps(job_manifest(make_plan(action, reply=reply)))
            assert CANARY not in job
            assert base64.b64encode(CANARY.encode()).decode()[:20] not in job
            stdin = make_task(action).stdin
            assert base64.b64encode(stdin).decode() not in job


def test_env_args_labels_and_annotations_hold_no_secret() -> None:
    job = job_manifest(make_plan("put", reply=True))
    texts = [*job["metadata"]["labels"].values(), *job["metadata"].get("annotations", {}).values()]
    for container in containers(job).values():
        texts += container["command"] + [e.get("value", "") for e in container.get("env", [])]
    assert texts and not [t for t in texts if CANARY in t]


def mount_paths(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def test_only_the_steps_get_store_credentials_and_only_as_files() -> None:
    job = job_manifest(make_plan("put"))
    cs = containers(job)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["store-credentials"]["secret"]["secretName"] == "resource-functions-store"
    for name in ("stage", "collect"):
        assert "envFrom" not in cs[name]  # never env vars: /proc/<pid>/environ stays clean
        assert mount_paths(cs[name])["store-credentials"] == pod_contract.STORE_CREDENTIALS_DIR
        env = {e["name"]: e["value"] for e in cs[name]["env"]}
        assert env["STORE_CREDENTIALS_DIR"] == pod_contract.STORE_CREDENTIALS_DIR
        assert env["STORE_URL"] == STORE_URL
        assert env["ARCHIVE_FORMAT"] == "zstd" and env["ARCHIVE_LEVEL"] == "3"
        assert env["AWS_ENDPOINT_URL_S3"] == "http://minio:9000"
    assert "envFrom" not in cs["resource"]
    assert "store-credentials" not in mount_paths(cs["resource"])
    assert {e["name"] for e in cs["resource"]["env"]} == set(protocol.build_env("get", Build()))


def test_no_store_secret_means_no_store_volume() -> None:
    config = KubernetesConfig(namespace="ns", service_account="sa", task_image="img")
    job = job_manifest(plan_for(make_task("get"), config, STORE_URL, reply=False))
    assert all("envFrom" not in c for c in containers(job).values())
    assert all("store-credentials" not in mount_paths(c) for c in containers(job).values())
    assert "store-credentials" not in {
        v["name"] for v in job["spec"]["template"]["spec"]["volumes"]
    }
    env = {e["name"] for c in containers(job).values() for e in c.get("env", [])}
    assert "STORE_CREDENTIALS_DIR" not in env


@pytest.mark.parametrize("action", ACTIONS)
def test_names_and_labels_are_valid(action: str) -> None:
    plan = make_plan(action)
    job = job_manifest(plan)
    secret = stdin_secret_manifest(plan, b"{}", OWNER_UID)
    names = [
        job["metadata"]["name"],
        secret["metadata"]["name"],
        pod_of(job)["metadata"]["name"],
        *containers(job),
    ]
    names += [v["name"] for v in job["spec"]["template"]["spec"]["volumes"]]
    for name in names:
        assert job_plan.DNS_LABEL.match(name) and len(name) <= 63, name
    assert job["metadata"]["name"] == f"rf-{action}-{plan.run_id[:20]}"
    for obj_labels in (
        job["metadata"]["labels"],
        job["spec"]["template"]["metadata"]["labels"],
        secret["metadata"]["labels"],
    ):
        assert obj_labels["app.kubernetes.io/managed-by"] == "resource-functions"
        assert obj_labels["resource-functions.dev/run-id"] == plan.run_id
        assert obj_labels["resource-functions.dev/action"] == action
        for value in obj_labels.values():
            assert len(value) <= 63 and re.match(LABEL_VALUE, value)


def test_job_name_is_the_same_for_every_delivery_and_differs_between_requests() -> None:
    assert make_plan(request_id="a").job_name == make_plan(request_id="a").job_name
    assert make_plan(request_id="a").job_name != make_plan(request_id="b").job_name
    with pytest.raises(ValueError):
        job_plan.job_name("get", "not-hex")


def test_resource_script_is_the_same_text_for_every_request() -> None:
    commands = [
        containers(job_manifest(make_plan(action, request_id=rid, secret=secret)))["resource"][
            "command"
        ]
        for action in ACTIONS
        for rid in ("a", "b")
        for secret in (CANARY, "other-secret-value")
    ]
    assert {tuple(c[:3]) for c in commands} == {("sh", "-c", RESOURCE_SCRIPT)}
    assert {tuple(c[3:]) for c in commands} == {
        ("resource", "/opt/resource/check", "1800"),
        ("resource", "/opt/resource/in", "1800", "/tmp/build/get"),
        ("resource", "/opt/resource/out", "1800", "/tmp/build/put"),
    }


def test_the_script_timeout_is_whole_seconds_within_the_deadline() -> None:
    plan = replace(make_plan("check"), timeout_seconds=0.2)
    assert containers(job_manifest(plan))["resource"]["command"][4:] == ["/opt/resource/check", "1"]
    assert replace(plan, timeout_seconds=59.5).script_timeout_seconds == 60
    assert plan.active_deadline_seconds > plan.script_timeout_seconds


def test_managed_by_is_exported_and_labels_every_object() -> None:
    assert pod_contract.MANAGED_BY == "resource-functions"
    assert podspec.labels(make_plan())["app.kubernetes.io/managed-by"] == pod_contract.MANAGED_BY


def test_the_job_and_its_pods_are_labelled_with_their_requests_source_and_id() -> None:
    """A sender finds (and stops) the Job of a request it sent by (source, id): the Tekton
    controller cancels a CustomRun's run by it."""
    from functions import keys

    manifest = job_manifest(make_plan(request_id="run-uid-r1"))
    wanted = keys.request_label("//ci.example.com", "run-uid-r1")
    assert manifest["metadata"]["labels"][labels.REQUEST_LABEL] == wanted
    assert manifest["spec"]["template"]["metadata"]["labels"][labels.REQUEST_LABEL] == wanted
    assert wanted != keys.request_label("//ci.example.com", "run-uid-r2")
    assert len(wanted) <= 63 and wanted.isalnum()


def collect_step(command: list[str]) -> CollectStep:
    """What the collect step reads from its container's command."""
    assert command[:4] == ["python", "-m", "functions", "collect"]
    return CollectStep.parse(command[4:])


def test_step_arguments() -> None:
    cs = containers(job_manifest(make_plan("put")))
    stage = cs["stage"]["command"]
    assert stage[:4] == ["python", "-m", "functions", "stage"]
    staged = StageStep.parse(stage[4:])
    assert staged.directory == "/tmp/build/put"
    assert dict(staged.inputs) == make_task("put").inputs
    get = make_plan("get", reply=True)
    collect = collect_step(containers(job_manifest(get))["collect"]["command"])
    assert (collect.run_id, collect.action) == (get.run_id, "get")
    assert collect.cache_key == "c" * 64 and collect.build_dir == "/tmp/build"
    assert collect.reply is not None and collect.reply.request_id == "evt-1"
    assert collect.reply.subject == "pipelines/main"
    sync = collect_step(containers(job_manifest(make_plan("check")))["collect"]["command"])
    assert sync.reply is None and sync.cache_key is None
    assert collect.history is None  # a get keeps no version history


@pytest.mark.parametrize(
    ("trace", "args"),
    [
        (TraceContext(PARENT, "congo=t61rcWkgMzE"), [PARENT, "congo=t61rcWkgMzE"]),
        (TraceContext(PARENT, ""), [PARENT, None]),
        (None, [None, None]),
    ],
    ids=["with-tracestate", "traceparent-alone", "untraced"],
)
def test_an_async_collect_is_given_the_trace_context_of_the_events_it_posts(
    trace: TraceContext | None, args: list[str | None]
) -> None:
    task = dataclasses.replace(make_task("check"), trace=trace)
    container = containers(job_manifest(plan_for(task, CONFIG, STORE_URL, reply=True)))["collect"]
    reply = collect_step(container["command"]).reply
    assert reply is not None and reply.trace == trace
    command = [arg.partition("=")[0] for arg in container["command"]]
    assert [a in command for a in ("--traceparent", "--tracestate")] == [
        v is not None for v in args
    ]
    sync = containers(job_manifest(plan_for(task, CONFIG, STORE_URL, reply=False)))["collect"]
    assert collect_step(sync["command"]).reply is None  # the function replies, with the trace


def test_a_check_tells_collect_where_its_version_history_is() -> None:
    task = dataclasses.replace(make_task("check"), history=HistoryPlan("h" * 64, limit=50))
    plan = plan_for(task, CONFIG, STORE_URL, reply=False)
    collect = collect_step(containers(job_manifest(plan))["collect"]["command"])
    assert collect.history == HistoryPlan("h" * 64, limit=50)


@pytest.mark.parametrize("value", ["repo=artifacts/x.tar.zst", f"repo=artifacts/x@y.tar@{DIGEST}"])
def test_input_arguments_round_trip(value: str) -> None:
    name, ref = parse_input(value)
    assert pod_contract.format_input(name, ref) == value


@pytest.mark.parametrize(
    "value",
    [
        f"repo=k.tar@{DIGEST.upper()}",
        "repo=k.tar@sha256:abc",
        f"repo=k.tar@{DIGEST}\n",
        f"repo=k.tar@{DIGEST}x",
    ],
    ids=["upper-case", "short", "newline", "trailing"],
)
def test_an_input_without_an_exact_digest_is_a_plain_key(value: str) -> None:
    name, ref = parse_input(value)
    assert (name, ref.key, ref.digest) == ("repo", value.partition("=")[2], None)


@pytest.mark.parametrize("value", ["repo", "=key", "repo="])
def test_malformed_input_arguments_are_refused(value: str) -> None:
    with pytest.raises(ValueError):
        parse_input(value)


def test_steps_are_unprivileged_non_root() -> None:
    cs = containers(job_manifest(make_plan("put")))
    for name in ("stage", "collect"):
        sc = cs[name]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert cs[name]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert cs["resource"]["securityContext"] == {"allowPrivilegeEscalation": False}
    assert (
        job_manifest(make_plan())["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 65532
    )


def test_deployment_pod_settings_apply_by_default() -> None:
    job = job_manifest(make_plan())
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "ci", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["imagePullSecrets"] == [{"name": "deploy-pull"}]
    for container in containers(job).values():
        assert container["resources"] == dict(CONFIG.resources)


def test_per_type_pod_settings_win() -> None:
    rt = ResourceType(
        image="registry.example.com/docker-image@" + DIGEST,
        privileged=True,
        resources={"limits": {"memory": "4Gi", "cpu": "2"}},
        node_selector={"pool": "builders"},
        tolerations=[{"key": "builders", "operator": "Equal", "value": "yes"}],
        image_pull_secrets=["type-pull"],
    )
    job = job_manifest(make_plan(resource_type=rt))
    pod = job["spec"]["template"]["spec"]
    cs = containers(job)
    assert cs["resource"]["image"] == rt.image
    assert cs["resource"]["securityContext"] == {"privileged": True}
    assert all("privileged" not in cs[n]["securityContext"] for n in ("collect",))
    assert pod["nodeSelector"] == {"pool": "builders"}
    assert pod["tolerations"] == [{"key": "builders", "operator": "Equal", "value": "yes"}]
    assert pod["imagePullSecrets"] == [{"name": "type-pull"}]
    assert cs["resource"]["resources"] == {  # the type's limits, the deployment's requests
        "limits": {"memory": "4Gi", "cpu": "2"},
        "requests": {"cpu": "100m", "memory": "128Mi"},
    }
    for version in VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)


def test_no_pod_settings_means_none_in_the_spec() -> None:
    config = KubernetesConfig(namespace="ns", service_account="sa", task_image="img")
    job = job_manifest(plan_for(make_task("get"), config, STORE_URL, reply=False))
    pod = job["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "imagePullSecrets"} & set(pod)
    assert all("resources" not in c for c in containers(job).values())


def test_secret_holds_stdin_and_is_owned_by_the_job() -> None:
    plan = make_plan()
    task = make_task()
    secret = stdin_secret_manifest(plan, task.stdin, OWNER_UID)
    assert base64.b64decode(secret["data"]["stdin"]) == task.stdin
    assert json.loads(base64.b64decode(secret["data"]["redact"])) == []
    resolved = stdin_secret_manifest(
        plan, task.stdin, OWNER_UID, ("pw", "token-1", "literal"), resolved=("pw", "token-1")
    )
    assert json.loads(base64.b64decode(resolved["data"]["redact"])) == ["pw", "token-1", "literal"]
    assert json.loads(base64.b64decode(resolved["data"]["resolved"])) == ["pw", "token-1"]
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert secret["metadata"]["name"] == plan.job_name + "-stdin"
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": plan.job_name, "uid": OWNER_UID}
    ]
    with pytest.raises(ValueError):
        stdin_secret_manifest(plan, task.stdin, "")


def test_request_source_is_an_annotation() -> None:
    job = job_manifest(make_plan())
    assert job["metadata"]["annotations"] == {
        "resource-functions.dev/request-source": "//ci.example.com"
    }


# --- the resource step's script, run by a real shell ----------------------------------------

RESOURCE_IN = """#!/bin/sh
payload=$(cat)
echo "in: dir=$1 args=$#" >&2
echo "payload: $payload" >&2
mkdir -p "$1/sub"
echo secret-file > "$1/sub/private"
chmod 600 "$1/sub/private"
echo '{"version": {"ref": "abc"}}'
exit "${EXIT_WITH:-0}"
"""
RESOURCE_CHECK = """#!/bin/sh
cat >/dev/null
echo "check args=$#" >&2
echo '[{"ref": "1"}]'
"""
# A get that overruns; with IGNORE_TERM it also survives SIGTERM (short sleeps, so nothing
# it started outlives the test once it is killed).
RESOURCE_SLOW = """#!/bin/sh
if [ -n "$IGNORE_TERM" ]; then trap '' TERM; fi
cat >/dev/null
echo "fetching into $1" >&2
while :; do sleep 1; done
"""


@pytest.fixture
def chroot(tmp_path: Path) -> Path:
    """A minimal root: busybox as /bin/sh, the two scripts, the stdin Secret, /tmp/build."""
    busybox = shutil.which("busybox")
    if os.geteuid() != 0 or not busybox:
        pytest.fail("running the resource script needs root (chroot) and busybox-static")
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin/busybox")
    for applet in ("sh", "cat", "mkdir", "chmod", "echo", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "opt/resource").mkdir(parents=True)
    for name, text in (("in", RESOURCE_IN), ("check", RESOURCE_CHECK)):
        (root / "opt/resource" / name).write_text(text)
        (root / "opt/resource" / name).chmod(0o755)
    (root / "secret").mkdir()
    (root / "secret/stdin").write_text('{"source":{"token":"' + CANARY + '"}}')
    (root / "tmp/build").mkdir(parents=True)
    (root / "dev").mkdir()
    os.mknod(root / "dev/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return root


def run_resource_step(
    root: Path, action: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> int:
    plan = make_plan(action)
    if timeout is not None:
        plan = replace(plan, timeout_seconds=timeout)
    command = containers(job_manifest(plan))["resource"]["command"]
    chroot_bin = shutil.which("chroot") or "/usr/sbin/chroot"
    result = subprocess.run(
        [chroot_bin, str(root), "/bin/sh", *command[1:]],
        env={"PATH": "/bin", **(env or {})},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.stdout == b"" and result.stderr == b"", result
    return result.returncode


def processes_in(root: Path) -> list[list[str]]:
    """The command lines of the processes running chrooted into ``root``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") == str(root):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"))
        except OSError:
            continue  # ended meanwhile
    return found


def settled(root: Path, seconds: float = 3.0) -> list[list[str]]:
    """Processes still in ``root`` after up to ``seconds``: a killed watchdog's last
    ``sleep`` (1 s, or 2 s after SIGTERM) may end a moment after the step."""
    end = time.monotonic() + seconds
    while (found := processes_in(root)) and time.monotonic() < end:
        time.sleep(0.1)
    return found


def test_resource_step_records_output_streams_and_exit_code(chroot: Path) -> None:
    assert run_resource_step(chroot, "get") == 0
    task = chroot / "tmp/build/.task"
    assert (task / "exit-code").read_text() == "0\n"
    assert json.loads((task / "stdout").read_text()) == {"version": {"ref": "abc"}}
    # The script's start and end, for collect's timings (StepTimings).
    assert (task / "started").read_bytes() == b""
    assert (task / "started").stat().st_mtime_ns <= (task / "exit-code").stat().st_mtime_ns
    stderr = (task / "stderr").read_text()
    assert "in: dir=/tmp/build/get args=1" in stderr and CANARY in stderr  # stdin arrived
    private = chroot / "tmp/build/get/sub/private"
    assert stat.S_IMODE(private.stat().st_mode) == 0o644  # readable by the non-root collect


def test_a_script_within_its_timeout_leaves_no_watchdog(chroot: Path) -> None:
    started = time.monotonic()
    assert run_resource_step(chroot, "get") == 0
    assert time.monotonic() - started < 5
    assert not (chroot / "tmp/build/.task/timed-out").exists()
    assert settled(chroot) == []  # the watchdog ended with the script


@pytest.mark.parametrize(("env", "killed_by"), [({}, "TERM"), ({"IGNORE_TERM": "1"}, "KILL")])
def test_an_overrunning_script_is_stopped_and_marked(
    chroot: Path, env: dict[str, str], killed_by: str
) -> None:
    (chroot / "opt/resource/in").write_text(RESOURCE_SLOW)
    started = time.monotonic()
    assert run_resource_step(chroot, "get", env, timeout=1) == 0
    elapsed = time.monotonic() - started
    task = chroot / "tmp/build/.task"
    assert (task / "exit-code").read_text() == "124\n"
    assert (task / "timed-out").read_text() == "1\n"  # collect: "ran longer than 1s"
    assert (task / "stderr").read_text() == "fetching into /tmp/build/get\n"
    assert stat.S_IMODE((task / "timed-out").stat().st_mode) & 0o044 == 0o044
    # TERM at 1 s; KILL 2 s later if ignored: well within terminationGracePeriodSeconds' reach.
    assert (1 <= elapsed < 3) if killed_by == "TERM" else (3 <= elapsed < 5.5), elapsed
    assert settled(chroot) == []


def test_a_failing_script_still_exits_zero(chroot: Path) -> None:
    assert run_resource_step(chroot, "get", {"EXIT_WITH": "3"}) == 0
    assert (chroot / "tmp/build/.task/exit-code").read_text() == "3\n"


def test_check_gets_no_directory_argument(chroot: Path) -> None:
    assert run_resource_step(chroot, "check") == 0
    assert (chroot / "tmp/build/.task/stderr").read_text() == "check args=0\n"
    assert not (chroot / "tmp/build/get").exists()


def test_a_missing_script_is_a_recorded_failure(chroot: Path) -> None:
    (chroot / "opt/resource/in").unlink()
    assert run_resource_step(chroot, "get") == 0
    assert (chroot / "tmp/build/.task/exit-code").read_text() == "127\n"


def test_a_stage_error_skips_the_script(chroot: Path) -> None:
    (chroot / "tmp/build/.task").mkdir()
    (chroot / "tmp/build/.task/stage-error").write_text("input 'repo': artifact missing\n")
    assert run_resource_step(chroot, "get") == 0
    assert not (chroot / "tmp/build/.task/exit-code").exists()
    assert not (chroot / "tmp/build/get").exists()


@pytest.mark.parametrize("action", ["check", "get", "put"])
def test_only_collect_gets_the_reply_address_and_only_for_async_replies(action: str) -> None:
    sink = "http://broker-ingress.knative-eventing.svc.cluster.local/rf/default"
    config = replace(CONFIG, sink=sink, reply_sink=sink)
    async_job = job_manifest(plan_for(make_task(action), config, STORE_URL, reply=True))
    for name, container in containers(async_job).items():
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env.get("K_SINK") == (sink if name == "collect" else None), name
    sync_job = job_manifest(plan_for(make_task(action), config, STORE_URL, reply=False))
    assert all("K_SINK" not in json.dumps(c) for c in containers(sync_job).values())
    assert sink not in json.dumps(sync_job)


def test_an_async_tasks_reply_token_reaches_collect_alone() -> None:
    plan = make_plan("get", reply=True)
    job = job_manifest(plan)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    token = volumes["reply-token"]["secret"]
    assert token["secretName"] == plan.secret_name
    assert token["items"] == [{"key": "reply-token", "path": "reply-token"}]
    cs = containers(job)
    assert mount_paths(cs["collect"])["reply-token"] == pod_contract.REPLY_TOKEN_DIR
    env = {e["name"]: e.get("value") for e in cs["collect"]["env"]}
    assert env["REPLY_TOKEN_FILE"] == pod_contract.REPLY_TOKEN_FILE
    assert env["K_SINK"] == "http://relay.example"  # TASK_REPLY_SINK, not the Broker
    for name in ("resource",):
        assert "reply-token" not in mount_paths(cs[name])
        assert "REPLY_TOKEN_FILE" not in {e["name"] for e in cs[name].get("env", [])}
    secret = stdin_secret_manifest(plan, b"{}", "uid-1", (), "the-token")
    assert base64.b64decode(secret["data"]["reply-token"]) == b"the-token"


def test_a_sync_task_has_no_reply_token() -> None:
    plan = make_plan("get", reply=False)
    job = job_manifest(plan)
    assert "reply-token" not in {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}
    assert "reply-token" not in stdin_secret_manifest(plan, b"{}", "uid-1")["data"]


def test_every_task_container_has_requests_and_limits_and_the_build_volume_a_size_limit() -> None:
    job = job_manifest(make_plan("put"))
    for name, container in containers(job).items():
        assert set(container["resources"]) >= {"requests", "limits"}, name
    (build,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "build"]
    assert build["emptyDir"] == {"sizeLimit": "8Gi"}


def test_a_type_sets_its_own_requests_limits_and_build_size() -> None:
    heavy = ResourceType(
        image="example.org/heavy@sha256:" + "e" * 64,
        resources={"limits": {"cpu": "4", "memory": "8Gi"}},
        build_size_limit="50Gi",
    )
    task = dataclasses.replace(make_task("get"), resource_type=heavy)
    job = job_manifest(plan_for(task, CONFIG, STORE_URL, reply=False))
    for container in containers(job).values():
        assert container["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
        assert container["resources"]["requests"] == CONFIG.resources["requests"]  # default kept
    (build,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "build"]
    assert build["emptyDir"] == {"sizeLimit": "50Gi"}


PINNED = replace(
    CONFIG,
    name_files=NameFiles(hosts="127.0.0.1 localhost\n", resolv_conf="nameserver 10.96.0.10\n"),
)


def pinned_plan(action: str, *, reply: bool = False) -> JobPlan:
    return plan_for(make_task(action), PINNED, STORE_URL, reply=reply)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("action", ACTIONS)
def test_pinned_name_files_validate_strictly(action: str, version: str) -> None:
    plan = pinned_plan(action, reply=True)
    job = job_manifest(plan)
    secret = stdin_secret_manifest(
        plan, make_task(action).stdin, OWNER_UID, name_files=PINNED.name_files
    )
    for obj in (job, pod_of(job), secret):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("action", ACTIONS)
def test_the_steps_resolve_with_read_only_copies_the_resource_never_mounts(action: str) -> None:
    plan = pinned_plan(action, reply=True)
    job = job_manifest(plan)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["name-files"]["secret"] == {
        "secretName": plan.secret_name,
        "optional": False,
        "defaultMode": 0o400,
        "items": [
            {"key": "hosts", "path": "hosts"},
            {"key": "resolv.conf", "path": "resolv.conf"},
        ],
    }
    steps = containers(job)
    assert ("stage" in steps) == (action == "put")
    for name, container in steps.items():
        pinned = [m for m in container["volumeMounts"] if m["name"] == "name-files"]
        if name == "resource":
            assert pinned == []
            assert not {"/etc/hosts", "/etc/resolv.conf"} & set(mounts(container).values())
        else:
            assert pinned == [
                {
                    "name": "name-files",
                    "mountPath": "/etc/hosts",
                    "subPath": "hosts",
                    "readOnly": True,
                },
                {
                    "name": "name-files",
                    "mountPath": "/etc/resolv.conf",
                    "subPath": "resolv.conf",
                    "readOnly": True,
                },
            ]
    secret = stdin_secret_manifest(plan, b"{}", OWNER_UID, name_files=PINNED.name_files)
    assert base64.b64decode(secret["data"]["hosts"]) == b"127.0.0.1 localhost\n"
    assert base64.b64decode(secret["data"]["resolv.conf"]) == b"nameserver 10.96.0.10\n"
    # the resource container's view of the Secret stays stdin and the values to redact
    assert [i["key"] for i in volumes["stdin"]["secret"]["items"]] == [
        "stdin",
        "redact",
        "resolved",
    ]


def test_unpinned_steps_get_no_copies_and_the_secret_none() -> None:
    plan = make_plan("put", reply=True)
    job = job_manifest(plan)
    assert "name-files" not in {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}
    paths = {p for c in containers(job).values() for p in mounts(c).values()}
    assert not {"/etc/hosts", "/etc/resolv.conf"} & paths
    assert not {"hosts", "resolv.conf"} & set(stdin_secret_manifest(plan, b"{}", OWNER_UID)["data"])


def test_the_secret_holds_the_name_files_exactly_when_the_job_mounts_them() -> None:
    with pytest.raises(ValueError, match="name files"):
        stdin_secret_manifest(pinned_plan("get"), b"{}", OWNER_UID)
    with pytest.raises(ValueError, match="name files"):
        stdin_secret_manifest(make_plan("get"), b"{}", OWNER_UID, name_files=PINNED.name_files)
