"""The task Job and its stdin Secret, as plain dicts built by pure functions from a ``JobPlan``
(``job_plan``: made by ``plan_for`` from a ``Task`` and the deployment's ``KubernetesConfig``).

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
import json
from typing import TYPE_CHECKING, Any

from functions.model import SCRIPTS, WORKDIRS
from functions.runtimes.kube.job_plan import JobPlan
from functions.runtimes.labels import (
    ACTION_LABEL,
    JOB_RUN_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    REQUEST_DIGEST_ANNOTATION,
    REQUEST_LABEL,
    REQUEST_SOURCE_ANNOTATION,
)
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
    StageStep,
)

if TYPE_CHECKING:
    from functions.runtimes.kube.name_files import NameFiles

STEP_UID = 65532  # stage/collect: the project image's non-root user
BUILD_VOLUME = "build"
STDIN_VOLUME = "stdin"
STORE_VOLUME = "store-credentials"
REPLY_VOLUME = "reply-token"
NAMES_VOLUME = "name-files"
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
        "initContainers": [*_stage_containers(plan), resource_container(plan)],
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
    return [step_container(plan, "stage", step.argv(), stdin=False)]


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
    container = step_container(plan, "collect", step.argv(), stdin=True, reply=bool(plan.reply))
    if plan.reply and plan.reply.sink:
        # The reply address and token go to collect alone (never to the resource container,
        # whose image could otherwise post forged replies).
        container["env"].append({"name": SINK_ENV, "value": plan.reply.sink})
    if plan.reply:
        container["env"].append({"name": REPLY_TOKEN_ENV, "value": REPLY_TOKEN_FILE})
    return container


def step_container(
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


def resource_container(plan: JobPlan) -> dict[str, Any]:
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
