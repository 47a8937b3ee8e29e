"""What a task Job is built from: the deployment's ``KubernetesConfig`` (read once from the
settings) and one task's ``JobPlan`` (``plan_for``: the per-type pod settings where the type
sets them, else the deployment's), and the names of its Job and stdin Secret. Plain values,
no secret: ``podspec`` renders them as manifests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from functions import keys
from functions.model import Action, ArtifactRef, HistoryPlan, LeaseHold, Task
from functions.runtimes.warm.pool import WARM_OFF
from functions.settings import WarmLimits
from functions.steps.budget import DEADLINE_SLACK_SECONDS, RESULT_WAIT_SECONDS, deadline_seconds
from functions.steps.pod_contract import ReplyPlan

if TYPE_CHECKING:
    from functions.runtimes.kube.name_files import NameFiles
    from functions.settings import Settings

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RUN_ID = re.compile(r"^[0-9a-f]{20,64}$")


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
        from functions.runtimes.kube import name_files

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
