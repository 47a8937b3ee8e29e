"""The task Job and its stdin Secret, as plain dicts built by pure functions from a ``JobPlan``
(itself made by ``plan_for`` from a ``Task`` and the deployment's ``KubernetesConfig``).

Pod layout (one shared ``emptyDir`` mounted at ``/tmp/build`` in every container)::

    init  stage     project image, put only: unpack the inputs into /tmp/build/put
    init  resource  the resource image: ``sh -c RESOURCE_SCRIPT``, stdin from the Secret,
                    stdout/stderr/exit code into /tmp/build/.task/, stops the script at
                    its timeout (then also .task/timed-out), always exits 0
    main  collect   project image: store artifact, log and result (and post the reply)

check and get have no inputs, so they have no ``stage`` container (one image start less);
``RESOURCE_SCRIPT`` creates ``/tmp/build/.task`` itself. The stdin Secret (the only place the
request's ``source``/``params`` live) is mounted into ``resource`` and ``collect`` (which
reads the values to redact beside stdin) and nowhere else; no env var, argument, label or
annotation carries anything from it. Store credentials reach ``stage``/``collect`` only,
as the files of the deployment's store Secret, which no other container mounts. When the
function pins them (``name_files``), ``stage``/``collect`` read ``/etc/hosts`` and
``/etc/resolv.conf`` from the same Secret (read-only, ``subPath``), not the pod's files that
the resource step may rewrite.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from functions import keys
from functions.model import SCRIPTS, WORKDIRS, Action, ArtifactRef, HistoryPlan, LeaseHold, Task
from functions.runtimes.labels import (
    ACTION_LABEL,
    JOB_RUN_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    REQUEST_DIGEST_ANNOTATION,
    REQUEST_LABEL,
    REQUEST_SOURCE_ANNOTATION,
    WARM_POD_KEY_LABEL,
    WARM_POD_OWNER_LABEL,
)
from functions.runtimes.warm import WARM_OFF
from functions.settings import WarmLimits
from functions.steps.budget import DEADLINE_SLACK_SECONDS, RESULT_WAIT_SECONDS, deadline_seconds
from functions.steps.pod_contract import (
    BUILD_DIR,
    ETC_HOSTS,
    ETC_RESOLV_CONF,
    EXIT_CODE_FILE,
    HOSTS_KEY,
    KILL_AFTER_SECONDS,
    MANAGED_BY,
    REDACT_KEY,
    REPLY_TOKEN_DIR,
    REPLY_TOKEN_ENV,
    REPLY_TOKEN_FILE,
    REPLY_TOKEN_KEY,
    RESOLV_CONF_KEY,
    RESOLVED_KEY,
    SECRET_DIR,
    SINK_ENV,
    STAGE_ERROR_FILE,
    STARTED_FILE,
    STDERR_FILE,
    STDIN_FILE,
    STDIN_KEY,
    STDOUT_FILE,
    STORE_CREDENTIALS_DIR,
    STORE_CREDENTIALS_ENV,
    STORE_URL_ENV,
    TASK_DIR,
    TIMED_OUT_EXIT_CODE,
    TIMED_OUT_FILE,
    CollectStep,
    ReplyPlan,
    StageStep,
)

if TYPE_CHECKING:
    from functions.runtimes.name_files import NameFiles
    from functions.settings import Settings

STEP_UID = 65532  # stage/collect: the project image's non-root user
BUILD_VOLUME = "build"
STDIN_VOLUME = "stdin"
STORE_VOLUME = "store-credentials"
REPLY_VOLUME = "reply-token"
NAMES_VOLUME = "name-files"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RUN_ID = re.compile(r"^[0-9a-f]{20,64}$")
TERMINATION_GRACE_SECONDS = 5  # the resource step ignores SIGTERM; see pod_spec

# The resource step. FIXED text: the script path, the timeout (whole seconds) and the working
# directory arrive as positional parameters ($1, $2, $3), so nothing from a request is ever
# interpolated into shell code. POSIX sh (busybox, dash, bash). It exits 0 whatever the
# script does: a failing init container would stop the pod before collect runs, and task
# pods cannot read container logs, so the exit code and both output streams go to files.
# A watchdog enforces the timeout (TERM, then KILL): the pod lives on, so collect stores the
# log and reports the timeout (activeDeadlineSeconds, with the margin, is only a backstop).
# It sleeps 1 s at a time, so once killed nothing of it outlives the step by more than 2 s.
# The chmod lets the non-root collect step read what the script wrote. The started file's
# mtime tells collect when the script started (exit-code's, when it ended). The working
# directory (a get's output, made in the fsGroup's set-group-ID volume; a put's inputs,
# unpacked by the non-root stage step) is given to a resource step running as root
# (``chown -h``: links themselves, never their targets), as on Podman: git refuses a
# repository that another user owns, and what the resource writes takes root's group.
RESOURCE_SCRIPT = f"""\
task={TASK_DIR}
if [ -e "$task/{STAGE_ERROR_FILE}" ]; then exit 0; fi
mkdir -p "$task"
script="$1"
limit="$2"
shift 2
if [ "$#" -gt 0 ]; then mkdir -p "$1"; fi
if [ "$#" -gt 0 ] && [ "$(id -u 2>/dev/null)" = 0 ]; then chown -R -h 0:0 "$1" 2>/dev/null; fi
: >"$task/{STARTED_FILE}"
"$script" "$@" <{STDIN_FILE} >"$task/{STDOUT_FILE}" 2>"$task/{STDERR_FILE}" &
pid=$!
(
  left="$limit"
  while [ "$left" -gt 0 ]; do sleep 1; left=$((left - 1)); done
  echo "$limit" >"$task/{TIMED_OUT_FILE}"
  kill -TERM "$pid"
  sleep {KILL_AFTER_SECONDS}
  kill -KILL "$pid"
) </dev/null >/dev/null 2>&1 &
watchdog=$!
wait "$pid" 2>/dev/null
code=$?
kill "$watchdog" 2>/dev/null
wait "$watchdog" 2>/dev/null
if [ -e "$task/{TIMED_OUT_FILE}" ]; then code={TIMED_OUT_EXIT_CODE}; fi
echo "$code" >"$task/{EXIT_CODE_FILE}"
chmod -R a+rX "$task" "$@" 2>/dev/null
exit 0
"""


@dataclass(frozen=True)
class JobPlan:
    """Everything the task Job is built from. Holds no secret: the stdin payload travels
    separately, into ``stdin_secret_manifest``."""

    run_id: str  # hex, from functions.keys.run_id
    action: Action
    namespace: str
    resource_image: str
    task_image: str  # project image, for stage and collect
    service_account: str
    timeout_seconds: float  # the resource script's budget
    margin_seconds: float  # on top, for stage and collect
    ttl_seconds: int
    store_url: str
    inputs: tuple[tuple[str, ArtifactRef], ...] = ()  # put only
    cache_key: str | None = None  # get only
    history: HistoryPlan | None = None  # check only: collect records the versions found
    lease: LeaseHold | None = None  # async check: collect releases it once it has recorded
    env: tuple[tuple[str, str], ...] = ()  # resource container: BUILD_* metadata
    step_env: tuple[tuple[str, str], ...] = ()  # stage/collect: non-secret store settings
    store_secret: str = ""  # Secret with store credentials, envFrom of stage/collect
    privileged: bool = False
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    reply: ReplyPlan | None = None
    request_source: str = ""  # for operators: an annotation on the Job
    request_digest: str = ""  # keys.request_digest: an annotation, checked on attaching
    request_label: str = ""  # keys.request_label: a label, to find a request's Job by
    build_size_limit: str = ""  # the build emptyDir's sizeLimit
    name_files: bool = False  # stage/collect read /etc/hosts and resolv.conf from the Secret

    @property
    def job_name(self) -> str:
        return job_name(self.action, self.run_id)

    @property
    def secret_name(self) -> str:
        return secret_name(self.job_name)

    @property
    def script_timeout_seconds(self) -> int:
        """The resource step's watchdog: whole seconds (POSIX ``sleep`` takes no fraction)."""
        return max(1, math.ceil(self.timeout_seconds))

    @property
    def active_deadline_seconds(self) -> int:
        return deadline_seconds(self.timeout_seconds, self.margin_seconds)


@dataclass(frozen=True)
class KubernetesConfig:
    """Deployment-wide settings of task Jobs (per-type settings override the pod ones)."""

    namespace: str
    service_account: str
    task_image: str
    ttl_seconds: int = 600
    margin_seconds: float = 300.0  # stage + collect, on top of the resource's timeout
    store_secret: str = ""
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    step_env: tuple[tuple[str, str], ...] = ()
    sink: str = ""  # K_SINK, for replies to asynchronous tasks that collect could not send
    # Where collect posts an asynchronous task's events: the reply relay (TASK_REPLY_SINK),
    # else K_SINK itself; with the key its reply tokens are made under (CACHE_SECRET).
    reply_sink: str = ""
    reply_secret: bytes = field(default=b"", repr=False)
    build_size_limit: str = ""  # the build emptyDir's sizeLimit (TASK_BUILD_SIZE_LIMIT)
    # The function's own name files for stage/collect (TASK_NAME_FILES), or None: the pod's.
    name_files: NameFiles | None = None
    watch_seconds: float = 60.0  # one watch request; then the runtime lists again
    deadline_slack_seconds: float = DEADLINE_SLACK_SECONDS  # past the Job's deadline: then act
    result_wait_seconds: float = RESULT_WAIT_SECONDS  # a completed Job's result may take this
    request_timeout: tuple[float, float] = (5.0, 30.0)  # connect, read
    warm: WarmLimits = WARM_OFF  # by hand: off; from_settings: WARM_CHECKS (default on)

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesConfig:
        from functions.runtimes import name_files

        return cls(
            namespace=settings.task_namespace,
            service_account=settings.task_service_account,
            task_image=settings.task_image,
            ttl_seconds=settings.task_ttl_seconds,
            margin_seconds=settings.task_margin_seconds,
            store_secret=settings.task_store_secret,
            resources=settings.task_resources,
            node_selector=settings.task_node_selector,
            tolerations=tuple(settings.task_tolerations),
            image_pull_secrets=tuple(settings.task_image_pull_secrets),
            step_env=settings.step_env,
            sink=settings.sink,
            reply_sink=settings.task_reply_sink or settings.sink,
            reply_secret=settings.cache_secret,
            build_size_limit=settings.task_build_size_limit,
            warm=settings.warm,
            name_files=name_files.from_settings(settings.task_name_files),
        )


def plan_for(task: Task, config: KubernetesConfig, store_url: str, *, reply: bool) -> JobPlan:
    """The Job plan of a task: per-type pod settings where the type sets them, else the
    deployment's. ``reply``: collect posts the reply event (asynchronous completion)."""
    rt, c = task.resource_type, config
    return JobPlan(
        run_id=task.run_id,
        action=task.action,
        namespace=c.namespace,
        resource_image=rt.image,
        task_image=c.task_image,
        service_account=c.service_account,
        timeout_seconds=task.timeout_seconds,
        margin_seconds=c.margin_seconds,
        ttl_seconds=c.ttl_seconds,
        store_url=store_url,
        inputs=tuple(sorted(task.inputs.items())),
        cache_key=task.cache_key,
        history=task.history,
        lease=task.lease,
        env=tuple(task.env.items()),
        step_env=c.step_env,
        store_secret=c.store_secret,
        privileged=rt.privileged,
        resources={**c.resources, **rt.resources},
        node_selector=rt.node_selector or c.node_selector,
        tolerations=tuple(rt.tolerations or c.tolerations),
        image_pull_secrets=tuple(rt.image_pull_secrets or c.image_pull_secrets),
        reply=(
            ReplyPlan(task.request_id, task.subject, c.reply_sink, task.trace, task.team)
            if reply
            else None
        ),
        build_size_limit=rt.build_size_limit or c.build_size_limit,
        request_source=task.request_source,
        request_digest=task.request_digest,
        request_label=keys.request_label(task.request_source, task.request_id)
        if task.request_id
        else "",
        name_files=c.name_files is not None,
    )


def job_name(action: str, run_id: str) -> str:
    """``rf-<action>-<first 20 hex of the run id>``: a DNS label, the same for every
    delivery of one request (so a redelivery finds the Job already there)."""
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} is not 20 to 64 lowercase hex digits")
    return f"rf-{action}-{run_id[:20]}"


def secret_name(job: str) -> str:
    return f"{job}-stdin"


def labels(plan: JobPlan) -> dict[str, str]:
    """Labels of the Job, its pods and its Secret."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        NAME_LABEL: "resource-functions",
        ACTION_LABEL: plan.action,
        JOB_RUN_LABEL: plan.run_id,
        **({REQUEST_LABEL: plan.request_label} if plan.request_label else {}),
    }


def job_manifest(plan: JobPlan) -> dict[str, Any]:
    """The batch/v1 Job of one task: one pod, never retried, deadline and TTL set."""
    metadata: dict[str, Any] = {
        "name": plan.job_name,
        "namespace": plan.namespace,
        "labels": labels(plan),
    }
    annotations = {REQUEST_SOURCE_ANNOTATION: plan.request_source} if plan.request_source else {}
    if plan.request_digest:
        annotations[REQUEST_DIGEST_ANNOTATION] = plan.request_digest
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": plan.active_deadline_seconds,
            "ttlSecondsAfterFinished": plan.ttl_seconds,
            "template": {"metadata": {"labels": labels(plan)}, "spec": pod_spec(plan)},
        },
    }


def pod_spec(plan: JobPlan) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The resource step's `sh -c` is PID 1 and ignores SIGTERM: don't hold a deleted
        # (timed-out) pod for the default 30 s.
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "serviceAccountName": plan.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # fsGroup makes the 0400 stdin file group-readable (0440) for the non-root collect
        # step and for resource images that run as a non-root user.
        "securityContext": {"fsGroup": STEP_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [*_stage_containers(plan), _resource_container(plan)],
        "containers": [_collect_container(plan)],
        "volumes": _volumes(plan),
    }
    if plan.node_selector:
        spec["nodeSelector"] = dict(plan.node_selector)
    if plan.tolerations:
        spec["tolerations"] = [dict(t) for t in plan.tolerations]
    if plan.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in plan.image_pull_secrets]
    return spec


def _volumes(plan: JobPlan) -> list[dict[str, Any]]:
    build: dict[str, Any] = {"sizeLimit": plan.build_size_limit} if plan.build_size_limit else {}
    volumes: list[dict[str, Any]] = [
        {"name": BUILD_VOLUME, "emptyDir": build},
        _secret_volume(STDIN_VOLUME, plan.secret_name, (STDIN_KEY, REDACT_KEY, RESOLVED_KEY)),
    ]
    if plan.reply:
        volumes.append(_secret_volume(REPLY_VOLUME, plan.secret_name, (REPLY_TOKEN_KEY,)))
    if plan.store_secret:
        volumes.append(_secret_volume(STORE_VOLUME, plan.store_secret, ()))
    if plan.name_files:
        volumes.append(_secret_volume(NAMES_VOLUME, plan.secret_name, (HOSTS_KEY, RESOLV_CONF_KEY)))
    return volumes


def _secret_volume(name: str, secret: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A Secret as files (0400; the pod's fsGroup makes them group-readable); ``keys``: only
    those, else every key."""
    source: dict[str, Any] = {"secretName": secret, "optional": False, "defaultMode": 0o400}
    if keys:
        source["items"] = [{"key": key, "path": key} for key in keys]
    return {"name": name, "secret": source}


def _mounts(
    *, stdin: bool, store: bool = False, reply: bool = False, names: bool = False
) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": BUILD_VOLUME, "mountPath": BUILD_DIR}]
    if stdin:
        mounts.append({"name": STDIN_VOLUME, "mountPath": SECRET_DIR, "readOnly": True})
    if store:
        mounts.append({"name": STORE_VOLUME, "mountPath": STORE_CREDENTIALS_DIR, "readOnly": True})
    if reply:
        mounts.append({"name": REPLY_VOLUME, "mountPath": REPLY_TOKEN_DIR, "readOnly": True})
    if names:
        # A mount at these paths makes the kubelet and the container runtime leave out the
        # pod's own files, which a root resource step may have rewritten.
        for path, key in ((ETC_HOSTS, HOSTS_KEY), (ETC_RESOLV_CONF, RESOLV_CONF_KEY)):
            mounts.append(
                {"name": NAMES_VOLUME, "mountPath": path, "subPath": key, "readOnly": True}
            )
    return mounts


def _stage_containers(plan: JobPlan) -> list[dict[str, Any]]:
    if plan.action != "put":
        return []
    step = StageStep(directory=str(WORKDIRS["put"]), inputs=plan.inputs)
    return [_step_container(plan, "stage", step.argv(), stdin=False)]


def _collect_container(plan: JobPlan) -> dict[str, Any]:
    step = CollectStep(
        run_id=plan.run_id,
        action=plan.action,
        cache_key=plan.cache_key,
        history=plan.history,
        lease=plan.lease,
        reply=plan.reply,
        request=plan.request_digest,
    )
    container = _step_container(plan, "collect", step.argv(), stdin=True, reply=bool(plan.reply))
    if plan.reply and plan.reply.sink:
        # The reply address and token go to collect alone (never to the resource container,
        # whose image could otherwise post forged replies).
        container["env"].append({"name": SINK_ENV, "value": plan.reply.sink})
    if plan.reply:
        container["env"].append({"name": REPLY_TOKEN_ENV, "value": REPLY_TOKEN_FILE})
    return container


def _step_container(
    plan: JobPlan, name: str, args: list[str], *, stdin: bool, reply: bool = False
) -> dict[str, Any]:
    """stage/collect: the project image, non-root, no privileges; the store's credentials
    as the files of its Secret (never env vars: see ``pod_contract.STORE_CREDENTIALS_DIR``)."""
    env = [{"name": STORE_URL_ENV, "value": plan.store_url}, {"name": "TMPDIR", "value": BUILD_DIR}]
    if plan.store_secret:
        env.append({"name": STORE_CREDENTIALS_ENV, "value": STORE_CREDENTIALS_DIR})
    ours = (STORE_URL_ENV, "TMPDIR", STORE_CREDENTIALS_ENV)
    env += [{"name": k, "value": v} for k, v in plan.step_env if k not in ours]
    container: dict[str, Any] = {
        "name": name,
        "image": plan.task_image,
        "command": ["python", "-m", "functions", *args],
        "env": env,
        "volumeMounts": _mounts(
            stdin=stdin, store=bool(plan.store_secret), reply=reply, names=plan.name_files
        ),
        # Without API rights to read logs, this is how the function learns why a step failed.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": STEP_UID,
            "runAsGroup": STEP_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return _with_resources(container, plan)


def _resource_container(plan: JobPlan) -> dict[str, Any]:
    workdir = WORKDIRS[plan.action]
    container: dict[str, Any] = {
        "name": "resource",
        "image": plan.resource_image,
        "command": [
            "sh",
            "-c",
            RESOURCE_SCRIPT,
            "resource",
            SCRIPTS[plan.action],
            str(plan.script_timeout_seconds),
            *([workdir] if workdir else []),
        ],
        "volumeMounts": _mounts(stdin=True),
        "securityContext": (
            {"privileged": True} if plan.privileged else {"allowPrivilegeEscalation": False}
        ),
    }
    if plan.env:
        container["env"] = [{"name": k, "value": v} for k, v in plan.env]
    return _with_resources(container, plan)


def _with_resources(container: dict[str, Any], plan: JobPlan) -> dict[str, Any]:
    # Same resources on all three: init containers run one at a time, so the pod's effective
    # request stays that of one container, and collect gets room to compress.
    if plan.resources:
        container["resources"] = {k: dict(v) for k, v in plan.resources.items()}
    return container


def stdin_secret_manifest(
    plan: JobPlan,
    stdin: bytes,
    owner_uid: str,
    secrets: tuple[str, ...] = (),
    reply_token: str = "",
    *,
    resolved: tuple[str, ...] = (),
    name_files: NameFiles | None = None,
) -> dict[str, Any]:
    """The Secret holding the script's stdin (and, for collect, the values to redact
    ``secrets`` and the resolved credential values ``resolved``: ``Task.secrets`` and
    ``Task.resolved``; for an asynchronous task, its ``reply_token``; for stage and collect,
    the ``name_files`` the plan pins), owned by the Job (garbage-collected with it).
    No ``blockOwnerDeletion``: that needs delete rights on the owner's finalizers."""
    if not owner_uid:
        raise ValueError("the stdin Secret needs the uid of the Job that owns it")
    if plan.name_files != (name_files is not None):
        raise ValueError("the stdin Secret holds the name files exactly when the Job mounts them")
    data = {
        STDIN_KEY: base64.b64encode(stdin).decode("ascii"),
        REDACT_KEY: base64.b64encode(json.dumps(list(secrets)).encode()).decode(),
        RESOLVED_KEY: base64.b64encode(json.dumps(list(resolved)).encode()).decode(),
    }
    if reply_token:
        data[REPLY_TOKEN_KEY] = base64.b64encode(reply_token.encode()).decode()
    if name_files is not None:
        data[HOSTS_KEY] = base64.b64encode(name_files.hosts.encode()).decode()
        data[RESOLV_CONF_KEY] = base64.b64encode(name_files.resolv_conf.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": plan.secret_name,
            "namespace": plan.namespace,
            "labels": labels(plan),
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": plan.job_name, "uid": owner_uid}
            ],
        },
        "data": data,
    }


# Warm check pods (docs/warm-checks.md): the resource image's container runs a static pause
# program, which an init container of the project image copies into an emptyDir (as Tekton
# injects its entrypoint); each check is a pods/exec of the check script.
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
    copy = _step_container(plan, "pause", [], stdin=False)
    copy["command"] = ["cp", PAUSE_IN_TASK_IMAGE, PAUSE_PROGRAM]
    copy["volumeMounts"] = [{"name": PAUSE_VOLUME, "mountPath": PAUSE_DIR}]
    copy["env"] = []
    copy.pop("terminationMessagePolicy", None)
    resource = _resource_container(plan)
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
