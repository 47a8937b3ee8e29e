"""Settings, read once from the environment into a typed, immutable object.

Every public variable is documented in the README's configuration table. Reading never
writes the environment; a malformed value raises ``ConfigError`` naming the variable. One
variable's value is read by ``setting_values``, RESOURCE_TYPES by ``resource_types``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from functions.model import ResourceType
from functions.redaction import DEFAULT_REDACT_KEYS
from functions.resource_types import (
    node_selector,
    parse_resource_types,
    task_resources,
    tolerations,
)
from functions.setting_values import (
    choice,
    dns_name,
    name_list,
    number,
    patterns,
    quantity,
    redact_keys,
    sender_teams,
    storage_setting,
    tekton_teams,
    text,
    whole,
)
from functions.steps.pod_contract import STEP_ENV
from functions.tracing import tracing_wanted
from storage.archive import ArchiveOptions, Limits
from storage.tuning import StoreOptions

T = TypeVar("T")

# Every task container's requests and limits unless TASK_RESOURCES or a type's "resources"
# say otherwise (a type's "requests" or "limits" replace these as a whole).
DEFAULT_TASK_RESOURCES = (
    '{"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}}'
)
RUNTIMES = ("container", "kubernetes")
REPLY_MODES = ("sync", "async")
CREDENTIALS_PROVIDERS = ("none", "dir", "kubernetes")


def default_store_url(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "/tmp")) / ".local/share")
    return "file://" + str(Path(base) / "resource-functions" / "store")


@dataclass(frozen=True)
class WarmLimits:
    """WARM_CHECKS, WARM_CHECK_IDLE_SECONDS, WARM_CHECK_MAX_AGE_SECONDS, WARM_CHECKS_PER_REPLICA,
    WARM_CHECKS_PER_TEAM, WARM_CHECKS_AT_ONCE, WARM_CHECK_WAIT_SECONDS, WARM_CHECK_PAUSE,
    WARM_CHECK_AGENT, WARM_CHECK_PRIORITY_CLASS, WARM_CHECK_IMAGE_SECONDS
    (docs/warm-checks.md)."""

    enabled: bool = True
    idle_seconds: float = 300.0
    max_age_seconds: float = 3600.0
    per_replica: int = 64  # warm containers (pods) of a replica
    per_team: int = 16  # ... of one team
    checks_at_once: int = 8  # in one warm container (its sources' checks)
    wait_seconds: float = 30.0  # for a warm container with room, before running without reuse
    pause: str = ""  # a static pause program on the engine's host, run as ``<pause> -P``
    agent: str = ""  # the static rf-agent on the engine's host (agent/), bind-mounted
    priority_class: str = ""  # warm pods' PriorityClass: their own quota scope (task-limits)
    image_seconds: float = 60.0  # an image reference's id is asked again after this (engine)


@dataclass(frozen=True)
class UploadLimits:
    """What the artifacts service takes in uploads (functions/tekton/uploads.py):
    ARTIFACT_UPLOADS at once per replica, ARTIFACT_UPLOADS_PER_HOUR and
    ARTIFACT_UPLOAD_BYTES_PER_HOUR per team; INPUTS_TTL_DAYS: how long an uploaded input is
    kept (functions/ledger/inputs.py)."""

    per_replica: int = 2
    count_per_hour: int = 120
    bytes_per_hour: int = 20 << 30
    inputs_ttl_days: int = 7


@dataclass(frozen=True)
class Settings:
    store_url: str
    runtime: str = "container"
    resource_types: dict[str, ResourceType] = field(default_factory=dict)
    cache_secret: bytes = field(default=b"", repr=False)
    cache_secret_generated: bool = False
    task_timeout_seconds: float = 3600.0
    reply_mode: str = "sync"
    history_limit: int = 1000  # HISTORY_LIMIT: versions kept per resource, the oldest dropped
    # MAX_RUNS_PER_TEAM: runs (containers, Jobs) in flight per team (build.team; requests
    # naming none are one team) on one replica; a request over it is 429 before it starts.
    max_runs_per_team: int = 8
    # CHECK_LEASE_SECONDS: lifetime of a resource's check lease (renewed while its check
    # runs), i.e. how long waiters wait for a holder that died; 0 turns the lease off. An
    # async check's task holds it for its whole budget instead (pod_contract.async_lease_seconds).
    check_lease_seconds: float = 30.0
    log_level: str = "info"
    task_namespace: str = "default"
    task_service_account: str = "resource-task"
    task_image: str = "resource-functions:latest"
    task_ttl_seconds: int = 600
    task_store_secret: str = ""
    task_margin_seconds: float = 300.0
    task_resources: dict[str, Any] = field(default_factory=dict)
    task_node_selector: dict[str, str] = field(default_factory=dict)
    task_tolerations: list[dict[str, Any]] = field(default_factory=list)
    task_image_pull_secrets: list[str] = field(default_factory=list)
    sink: str = ""  # K_SINK: where asynchronous replies go
    task_reply_sink: str = ""  # TASK_REPLY_SINK: where task pods post them (the reply relay)
    task_build_size_limit: str = "8Gi"  # TASK_BUILD_SIZE_LIMIT: the build emptyDir's sizeLimit
    # TASK_NAME_FILES: auto (stage/collect resolve with the function's own name files when it
    # runs in the cluster) or off (functions.runtimes.kube.name_files)
    task_name_files: str = "auto"
    credentials_provider: str = "none"  # CREDENTIALS_PROVIDER: resolves ((var)) references
    credentials_dir: str = ""  # CREDENTIALS_DIR
    credentials_kubernetes_namespace_prefix: str = "concourse-"
    allowed_images: tuple[str, ...] = ("*",)  # ALLOWED_IMAGES: globs for an explicit image
    sender_audience: str = ""  # SENDER_AUDIENCE: require a Kubernetes token for it
    # ARTIFACT_AUDIENCE: the audience of the Task pods' tokens the artifacts service takes
    artifact_audience: str = "resource-functions-artifacts"
    # TEKTON_TEAMS: namespace -> team; None: namespaces labelled resource-functions.dev/team
    tekton_teams: dict[str, str] | None = None
    allowed_senders: tuple[str, ...] = ("*",)  # ALLOWED_SENDERS: globs of token usernames
    # REDACT_KEYS: globs of the keys of source/params whose literal values are secrets
    redact_keys: tuple[str, ...] = DEFAULT_REDACT_KEYS
    # SENDER_TEAMS: sender identity glob -> team globs it may name (service.teams)
    sender_teams: tuple[tuple[str, tuple[str, ...]], ...] = ()
    docker_api_version: str = "1.41"
    container_network: str = ""
    work_dir: str = ""
    # A replica answers a get from a cache record in memory while it saw the artifact within
    # this many seconds (0: it looks in the store on every hit).
    cache_recheck_seconds: float = 1.0
    tracing: bool = False  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT set: runs exported as spans
    archive: ArchiveOptions = field(default_factory=ArchiveOptions)
    limits: Limits = field(default_factory=Limits)
    store_options: StoreOptions = field(default_factory=StoreOptions)
    host: str = "127.0.0.1"  # HOST: loopback unless told (Knative's config says 0.0.0.0)
    port: int = 8080
    threads: int = 16
    # The client libraries' own variables, handed to them (not interpreted here):
    engine_env: dict[str, str] = field(default_factory=dict)  # DOCKER_*, XDG_RUNTIME_DIR
    kubeconfig: str = ""  # KUBECONFIG
    step_env: tuple[tuple[str, str], ...] = ()  # STEP_ENV: copied into task pods
    warm: WarmLimits = field(default_factory=WarmLimits)  # WARM_CHECK*: docs/warm-checks.md
    uploads: UploadLimits = field(default_factory=UploadLimits)  # ARTIFACT_UPLOAD*, INPUTS_TTL_DAYS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        secret = env.get("CACHE_SECRET", "")
        return cls(
            store_url=env.get("STORE_URL") or default_store_url(env),
            runtime=choice(env, "RUNTIME", RUNTIMES, "container"),
            resource_types=parse_resource_types(env.get("RESOURCE_TYPES", "")),
            cache_secret=secret.encode() if secret else secrets.token_bytes(32),
            cache_secret_generated=not secret,
            task_timeout_seconds=number(env, "TASK_TIMEOUT_SECONDS", 3600.0),
            reply_mode=choice(env, "REPLY_MODE", REPLY_MODES, "sync"),
            history_limit=whole(env, "HISTORY_LIMIT", 1000),
            max_runs_per_team=whole(env, "MAX_RUNS_PER_TEAM", 8),
            check_lease_seconds=number(env, "CHECK_LEASE_SECONDS", 30.0, zero=True),
            log_level=choice(env, "LOG_LEVEL", ("debug", "info", "warning", "error"), "info"),
            task_namespace=env.get("TASK_NAMESPACE") or own_namespace(),
            task_service_account=env.get("TASK_SERVICE_ACCOUNT") or "resource-task",
            task_image=env.get("TASK_IMAGE") or "resource-functions:latest",
            task_ttl_seconds=int(number(env, "TASK_TTL_SECONDS", 600)),
            task_store_secret=dns_name(env, "TASK_STORE_SECRET"),
            task_margin_seconds=number(env, "TASK_MARGIN_SECONDS", 300.0),
            task_resources=_pod_setting(
                env, "TASK_RESOURCES", task_resources, DEFAULT_TASK_RESOURCES
            ),
            task_node_selector=_pod_setting(env, "TASK_NODE_SELECTOR", node_selector),
            task_tolerations=_pod_setting(env, "TASK_TOLERATIONS", tolerations),
            task_image_pull_secrets=name_list(env, "TASK_IMAGE_PULL_SECRETS"),
            sink=env.get("K_SINK", ""),
            task_reply_sink=text(env, "TASK_REPLY_SINK"),
            task_build_size_limit=quantity(env, "TASK_BUILD_SIZE_LIMIT", "8Gi"),
            task_name_files=choice(env, "TASK_NAME_FILES", ("auto", "off"), "auto"),
            credentials_provider=_credentials_provider(env),
            credentials_dir=env.get("CREDENTIALS_DIR", ""),
            credentials_kubernetes_namespace_prefix=env.get(
                "CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX", "concourse-"
            ).strip(),
            allowed_images=patterns(env.get("ALLOWED_IMAGES")),
            sender_audience=text(env, "SENDER_AUDIENCE"),
            artifact_audience=text(env, "ARTIFACT_AUDIENCE", "resource-functions-artifacts"),
            tekton_teams=tekton_teams(env.get("TEKTON_TEAMS", "")),
            allowed_senders=patterns(env.get("ALLOWED_SENDERS")),
            redact_keys=redact_keys(env.get("REDACT_KEYS")),
            sender_teams=sender_teams(env.get("SENDER_TEAMS", ""), env.get("SENDER_AUDIENCE", "")),
            docker_api_version=env.get("DOCKER_API_VERSION") or "1.41",
            container_network=env.get("CONTAINER_NETWORK", ""),
            work_dir=env.get("WORK_DIR", ""),
            cache_recheck_seconds=number(env, "CACHE_RECHECK_SECONDS", 1.0),
            tracing=tracing_wanted(env),
            archive=storage_setting(ArchiveOptions.from_env, env),
            limits=storage_setting(Limits.from_env, env),
            store_options=storage_setting(StoreOptions.from_env, env),
            host=env.get("HOST") or "127.0.0.1",
            port=whole(env, "PORT", 8080),
            threads=whole(env, "THREADS", 16),
            engine_env=_client_env(env),
            kubeconfig=env.get("KUBECONFIG", ""),
            step_env=tuple((name, env[name]) for name in STEP_ENV if env.get(name)),
            warm=warm_limits(env),
            uploads=upload_limits(env),
        )


def open_to_the_network(settings: Settings, host: str) -> str | None:
    """What a service listening on ``host`` leaves open, or None: beyond loopback, without
    sender authentication anyone who reaches the port may name any team (and so use its
    credentials), and without ALLOWED_IMAGES run any image."""
    if host in ("127.0.0.1", "::1", "localhost") or settings.sender_audience:
        return None
    if settings.allowed_images != ("*",):
        return None
    return (
        f"listening on {host} with no sender authentication (SENDER_AUDIENCE) and every image "
        "allowed (ALLOWED_IMAGES unset): anyone who reaches this port may run any image and "
        "name any team, whose ((var)) credentials then resolve"
    )


def warm_limits(env: Mapping[str, str]) -> WarmLimits:
    """Warm check containers (docs/warm-checks.md): WARM_CHECKS=off turns reuse off."""
    default = WarmLimits()
    return WarmLimits(
        enabled=choice(env, "WARM_CHECKS", ("on", "off"), "on") == "on",
        idle_seconds=number(env, "WARM_CHECK_IDLE_SECONDS", default.idle_seconds),
        max_age_seconds=number(env, "WARM_CHECK_MAX_AGE_SECONDS", default.max_age_seconds),
        per_replica=whole(env, "WARM_CHECKS_PER_REPLICA", default.per_replica),
        per_team=whole(env, "WARM_CHECKS_PER_TEAM", default.per_team),
        checks_at_once=whole(env, "WARM_CHECKS_AT_ONCE", default.checks_at_once),
        wait_seconds=number(env, "WARM_CHECK_WAIT_SECONDS", default.wait_seconds, zero=True),
        pause=env.get("WARM_CHECK_PAUSE", "").strip(),
        agent=env.get("WARM_CHECK_AGENT", "").strip(),
        priority_class=env.get("WARM_CHECK_PRIORITY_CLASS", "").strip(),
        image_seconds=number(env, "WARM_CHECK_IMAGE_SECONDS", default.image_seconds, zero=True),
    )


def upload_limits(env: Mapping[str, str]) -> UploadLimits:
    default = UploadLimits()
    return UploadLimits(
        per_replica=whole(env, "ARTIFACT_UPLOADS", default.per_replica),
        count_per_hour=whole(env, "ARTIFACT_UPLOADS_PER_HOUR", default.count_per_hour),
        bytes_per_hour=whole(env, "ARTIFACT_UPLOAD_BYTES_PER_HOUR", default.bytes_per_hour),
        inputs_ttl_days=whole(env, "INPUTS_TTL_DAYS", default.inputs_ttl_days),
    )


def _pod_setting(
    env: Mapping[str, str], name: str, parse: Callable[[Any, str], T], default: str = ""
) -> T:
    """A deployment-wide pod setting (TASK_RESOURCES, …): JSON of the shape a type's takes."""
    return parse(env.get(name, default), name)


def _credentials_provider(env: Mapping[str, str]) -> str:
    """CREDENTIALS_PROVIDER; unset: ``dir`` when CREDENTIALS_DIR is set, else ``none``."""
    default = "dir" if env.get("CREDENTIALS_DIR") else "none"
    return choice(env, "CREDENTIALS_PROVIDER", CREDENTIALS_PROVIDERS, default)


def _client_env(env: Mapping[str, str]) -> dict[str, str]:
    """The container engine client's own variables (DOCKER_*, XDG_RUNTIME_DIR), as given."""
    return {k: v for k, v in env.items() if k.startswith("DOCKER_") or k == "XDG_RUNTIME_DIR"}


def own_namespace() -> str:
    """The namespace this process runs in (its ServiceAccount's), or ``default`` outside a pod."""
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"
