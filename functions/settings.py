"""Settings, read once from the environment into a typed, immutable object.

Every public variable is documented in the README's configuration table. Reading never
writes the environment; a malformed value raises ``ConfigError`` naming the variable.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from functions.errors import ConfigError
from functions.model import ResourceType
from functions.redaction import DEFAULT_REDACT_KEYS
from functions.steps.pod_contract import STEP_ENV
from functions.tracing import tracing_wanted
from storage.archive import ArchiveOptions, Limits
from storage.tuning import StoreOptions, env_int

T = TypeVar("T")

# The embedded catalogue: Concourse's core resource types, by name.
DEFAULT_RESOURCE_TYPES = {
    "git": "docker.io/concourse/git-resource:1.17",
    "time": "docker.io/concourse/time-resource:1.8",
    "registry-image": "docker.io/concourse/registry-image-resource:1.11",
    "s3": "docker.io/concourse/s3-resource:1.3",
    "semver": "docker.io/concourse/semver-resource:1.8",
    "github-release": "docker.io/concourse/github-release-resource:1.9",
    "mock": "docker.io/concourse/mock-resource:0.13",
}

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
    WARM_CHECKS_PER_TEAM, WARM_CHECK_PAUSE, WARM_CHECK_IMAGE_SECONDS (see the README's
    configuration table)."""

    enabled: bool = True
    idle_seconds: float = 300.0
    max_age_seconds: float = 3600.0
    per_replica: int = 64
    per_team: int = 16
    pause: str = ""  # a static pause program on the engine's host, run as ``<pause> -P``
    image_seconds: float = 60.0  # an image reference's id is asked again after this (engine)


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
    # runs in the cluster) or off (functions.runtimes.name_files)
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        secret = env.get("CACHE_SECRET", "")
        return cls(
            store_url=env.get("STORE_URL") or default_store_url(env),
            runtime=_choice(env, "RUNTIME", RUNTIMES, "container"),
            resource_types=parse_resource_types(env.get("RESOURCE_TYPES", "")),
            cache_secret=secret.encode() if secret else secrets.token_bytes(32),
            cache_secret_generated=not secret,
            task_timeout_seconds=_number(env, "TASK_TIMEOUT_SECONDS", 3600.0),
            reply_mode=_choice(env, "REPLY_MODE", REPLY_MODES, "sync"),
            history_limit=_whole(env, "HISTORY_LIMIT", 1000),
            max_runs_per_team=_whole(env, "MAX_RUNS_PER_TEAM", 8),
            check_lease_seconds=_number(env, "CHECK_LEASE_SECONDS", 30.0, zero=True),
            log_level=_choice(env, "LOG_LEVEL", ("debug", "info", "warning", "error"), "info"),
            task_namespace=env.get("TASK_NAMESPACE") or own_namespace(),
            task_service_account=env.get("TASK_SERVICE_ACCOUNT") or "resource-task",
            task_image=env.get("TASK_IMAGE") or "resource-functions:latest",
            task_ttl_seconds=int(_number(env, "TASK_TTL_SECONDS", 600)),
            task_store_secret=_dns_name(env, "TASK_STORE_SECRET"),
            task_margin_seconds=_number(env, "TASK_MARGIN_SECONDS", 300.0),
            task_resources=task_resources(
                env.get("TASK_RESOURCES", DEFAULT_TASK_RESOURCES), "TASK_RESOURCES"
            ),
            task_node_selector=node_selector(
                env.get("TASK_NODE_SELECTOR", ""), "TASK_NODE_SELECTOR"
            ),
            task_tolerations=tolerations(env.get("TASK_TOLERATIONS", ""), "TASK_TOLERATIONS"),
            task_image_pull_secrets=_name_list(env, "TASK_IMAGE_PULL_SECRETS"),
            sink=env.get("K_SINK", ""),
            task_reply_sink=env.get("TASK_REPLY_SINK", "").strip(),
            task_build_size_limit=_quantity(env, "TASK_BUILD_SIZE_LIMIT", "8Gi"),
            task_name_files=_choice(env, "TASK_NAME_FILES", ("auto", "off"), "auto"),
            credentials_provider=_choice(
                env,
                "CREDENTIALS_PROVIDER",
                CREDENTIALS_PROVIDERS,
                "dir" if env.get("CREDENTIALS_DIR") else "none",
            ),
            credentials_dir=env.get("CREDENTIALS_DIR", ""),
            credentials_kubernetes_namespace_prefix=env.get(
                "CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX", "concourse-"
            ).strip(),
            allowed_images=patterns(env.get("ALLOWED_IMAGES")),
            sender_audience=env.get("SENDER_AUDIENCE", "").strip(),
            artifact_audience=env.get("ARTIFACT_AUDIENCE", "").strip()
            or "resource-functions-artifacts",
            tekton_teams=tekton_teams(env.get("TEKTON_TEAMS", "")),
            allowed_senders=patterns(env.get("ALLOWED_SENDERS")),
            redact_keys=redact_keys(env.get("REDACT_KEYS")),
            sender_teams=sender_teams(env.get("SENDER_TEAMS", ""), env.get("SENDER_AUDIENCE", "")),
            docker_api_version=env.get("DOCKER_API_VERSION") or "1.41",
            container_network=env.get("CONTAINER_NETWORK", ""),
            work_dir=env.get("WORK_DIR", ""),
            cache_recheck_seconds=_number(env, "CACHE_RECHECK_SECONDS", 1.0),
            tracing=tracing_wanted(env),
            archive=_storage_setting(ArchiveOptions.from_env, env),
            limits=_storage_setting(Limits.from_env, env),
            store_options=_storage_setting(StoreOptions.from_env, env),
            host=env.get("HOST") or "127.0.0.1",
            port=_whole(env, "PORT", 8080),
            threads=_whole(env, "THREADS", 16),
            engine_env={
                k: v for k, v in env.items() if k.startswith("DOCKER_") or k == "XDG_RUNTIME_DIR"
            },
            kubeconfig=env.get("KUBECONFIG", ""),
            step_env=tuple((name, env[name]) for name in STEP_ENV if env.get(name)),
            warm=warm_limits(env),
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


def patterns(value: str | None) -> tuple[str, ...]:
    """A list of glob patterns (comma or whitespace separated): ALLOWED_IMAGES, ALLOWED_SENDERS.
    Unset: ``*`` (everything); empty or ``none``: nothing (for images: catalogue types only)."""
    if value is None:
        return ("*",)
    found = tuple(p for p in re.split(r"[,\s]+", value.strip()) if p)
    return () if found == ("none",) else found


def redact_keys(value: str | None) -> tuple[str, ...]:
    """REDACT_KEYS: globs (comma or whitespace separated); ``default`` stands for the
    built-in list, so ``default,access_key_id`` adds one. Unset: the built-in list; empty or
    ``none``: no literal value is redacted (resolved values and URL userinfo still are)."""
    if value is None:
        return DEFAULT_REDACT_KEYS
    found = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    if found == ["none"]:
        return ()
    expanded = (DEFAULT_REDACT_KEYS if p == "default" else (p,) for p in found)
    return tuple(dict.fromkeys(key for keys in expanded for key in keys))


def tekton_teams(value: str) -> dict[str, str] | None:
    """TEKTON_TEAMS: a JSON object of namespace → team; only the namespaces it names are
    served. Empty: the namespaces an administrator labelled (functions.tekton.namespace_teams)."""
    if not value.strip():
        return None
    try:
        parsed = json.loads(value)
    except ValueError as err:
        raise ConfigError(f"TEKTON_TEAMS is not valid JSON: {err}") from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in parsed.items()
    ):
        raise ConfigError("TEKTON_TEAMS must be a JSON object of namespace to team names")
    return parsed


def sender_teams(value: str, audience: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """SENDER_TEAMS: a JSON object of sender identity globs to lists of team globs."""
    if not value.strip():
        return ()
    if not audience.strip():
        raise ConfigError("SENDER_TEAMS needs SENDER_AUDIENCE: without it no sender is known")
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as err:
        raise ConfigError(f"SENDER_TEAMS is not valid JSON: {err}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(teams, list) and all(isinstance(t, str) for t in teams) for teams in raw.values()
    ):
        raise ConfigError(
            "SENDER_TEAMS must be a JSON object of sender globs to lists of team globs, e.g. "
            '{"system:serviceaccount:ci:engine": ["main", "blue-*"]}'
        )
    return tuple((sender, tuple(teams)) for sender, teams in raw.items())


def _storage_setting(read: Callable[[Mapping[str, str]], T], env: Mapping[str, str]) -> T:
    """The storage layer's own settings; their ValueError becomes a ConfigError."""
    try:
        return read(env)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def parse_resource_types(value: str) -> dict[str, ResourceType]:
    """RESOURCE_TYPES: a JSON object (or a path to a file holding one) mapping a type name to
    an image, or to {"image", "privileged", "timeout_seconds", "resources", "node_selector",
    "tolerations", "image_pull_secrets", "check_every"}. Unset: the embedded catalogue."""
    if not value.strip():
        raw: Any = DEFAULT_RESOURCE_TYPES
    else:
        raw = _load_json_or_file(value)
    if not isinstance(raw, dict):
        raise ConfigError("RESOURCE_TYPES must be a JSON object mapping type names to images")
    return {name: _resource_type(name, spec) for name, spec in raw.items()}


def _resource_type(name: str, spec: Any) -> ResourceType:
    where = f"RESOURCE_TYPES[{name!r}]"
    if isinstance(spec, str):
        spec = {"image": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("image"), str) or not spec["image"]:
        raise ConfigError(f"{where} must be an image name or an object with an 'image'")
    known = {f for f in ResourceType.__dataclass_fields__}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; known: {sorted(known)}")
    try:
        resource_type = ResourceType(**spec)
    except TypeError as err:
        raise ConfigError(f"{where}: {err}") from None
    _check_pod_settings(resource_type, where)
    return resource_type


def _check_pod_settings(spec: ResourceType, where: str) -> None:
    """The per-type pod settings have the shapes the task pod spec needs."""
    task_resources(spec.resources, f"{where}.resources")
    node_selector(spec.node_selector, f"{where}.node_selector")
    tolerations(spec.tolerations, f"{where}.tolerations")
    if not isinstance(spec.privileged, bool):
        raise ConfigError(f"{where}.privileged must be true or false")
    timeout = spec.timeout_seconds
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise ConfigError(f"{where}.timeout_seconds must be a positive number of seconds")
    if not isinstance(spec.build_size_limit, str) or (
        spec.build_size_limit and not _QUANTITY.match(spec.build_size_limit)
    ):
        raise ConfigError(f"{where}.build_size_limit must be a Kubernetes quantity such as 8Gi")
    if spec.check_every is not None and not is_seconds(spec.check_every):
        raise ConfigError(f"{where}.check_every must be a number of seconds, 0 or more")
    pull = spec.image_pull_secrets
    if not isinstance(pull, list) or not all(
        isinstance(n, str) and _DNS_SUBDOMAIN.match(n) for n in pull
    ):
        raise ConfigError(f"{where}.image_pull_secrets must be a list of Secret names")


def is_seconds(value: Any) -> bool:
    """Whether ``value`` is a JSON number of seconds, 0 or more (not a bool, not NaN/inf)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0 <= value < float("inf")
    )


RESOURCE_KEYS = ("requests", "limits", "claims")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def task_resources(value: Any, where: str) -> dict[str, Any]:
    """Container resources, as in a pod spec: {"requests": {...}, "limits": {...}}. Quantities
    are strings or numbers; Kubernetes checks their syntax when the Job is created."""
    value = _json_value(value, where, dict)
    unknown = sorted(set(value) - set(RESOURCE_KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; known: {list(RESOURCE_KEYS)}")
    for key in ("requests", "limits"):
        quantities = value.get(key, {})
        if not isinstance(quantities, dict) or not all(
            isinstance(q, (str, int, float)) and not isinstance(q, bool)
            for q in quantities.values()
        ):
            raise ConfigError(f"{where}.{key} must map resource names to quantities")
    return cast(dict[str, Any], value)


def node_selector(value: Any, where: str) -> dict[str, str]:
    """A pod nodeSelector: a JSON object of label names to string values."""
    value = _json_value(value, where, dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where} must map label names to string values")
    return cast(dict[str, str], value)


def tolerations(value: Any, where: str) -> list[dict[str, Any]]:
    """Pod tolerations: a JSON list of objects with the Kubernetes toleration fields."""
    value = _json_value(value, where, list)
    known = {"key", "operator", "value", "effect", "tolerationSeconds"}
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - known:
            raise ConfigError(f"{where}[{i}] must be an object with keys among {sorted(known)}")
    return cast(list[dict[str, Any]], value)


def _json_value(value: Any, where: str, kind: type) -> Any:
    """``value`` itself if already parsed, else JSON text ('' means empty) of type ``kind``."""
    if isinstance(value, str):
        if not value.strip():
            return kind()
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where} is not valid JSON: {err}") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{where} must be a JSON {'object' if kind is dict else 'list'}")
    return value


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def _quantity(env: Mapping[str, str], name: str, default: str) -> str:
    """A Kubernetes quantity (e.g. 8Gi); empty: none (no limit)."""
    value = env.get(name, default).strip()
    if value and not _QUANTITY.match(value):
        raise ConfigError(f"{name}={value!r}: expected a Kubernetes quantity such as 8Gi")
    return value


def _dns_name(env: Mapping[str, str], name: str) -> str:
    value = (env.get(name) or "").strip()
    if value and not _DNS_SUBDOMAIN.match(value):
        raise ConfigError(f"{name}={value!r}: expected a Kubernetes object name")
    return value


def _name_list(env: Mapping[str, str], name: str) -> list[str]:
    """A comma-separated list of Kubernetes object names ('' means none)."""
    names = [item.strip() for item in (env.get(name) or "").split(",") if item.strip()]
    for item in names:
        if not _DNS_SUBDOMAIN.match(item):
            raise ConfigError(f"{name}: {item!r} is not a Kubernetes object name")
    return names


def _load_json_or_file(value: str) -> Any:
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as err:
            raise ConfigError(f"RESOURCE_TYPES: cannot read {value}: {err.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"RESOURCE_TYPES is not valid JSON: {err}") from None


def warm_limits(env: Mapping[str, str]) -> WarmLimits:
    """Warm check containers (docs/warm-checks.md): WARM_CHECKS=off turns reuse off."""
    default = WarmLimits()
    return WarmLimits(
        enabled=_choice(env, "WARM_CHECKS", ("on", "off"), "on") == "on",
        idle_seconds=_number(env, "WARM_CHECK_IDLE_SECONDS", default.idle_seconds),
        max_age_seconds=_number(env, "WARM_CHECK_MAX_AGE_SECONDS", default.max_age_seconds),
        per_replica=_whole(env, "WARM_CHECKS_PER_REPLICA", default.per_replica),
        per_team=_whole(env, "WARM_CHECKS_PER_TEAM", default.per_team),
        pause=env.get("WARM_CHECK_PAUSE", "").strip(),
        image_seconds=_number(env, "WARM_CHECK_IMAGE_SECONDS", default.image_seconds, zero=True),
    )


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = (env.get(name) or default).strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def _number(env: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
    """A positive number (or zero too, when ``zero`` says it means "off")."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if not (value > 0 or (value == 0 and zero)):  # NaN fails both
        raise ConfigError(f"{name}={raw!r}: must be {'zero or ' if zero else ''}positive")
    return value


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    value = _storage_setting(partial(env_int, name=name, default=default), env)
    if value < 1:
        raise ConfigError(f"{name}={value}: expected a positive whole number")
    return value


def own_namespace() -> str:
    """The namespace this process runs in (its ServiceAccount's), or ``default`` outside a pod."""
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"
