"""RESOURCE_TYPES, the catalogue of resource types: parsed, each type's settings checked; and
the shapes of the pod settings (resources, node selector, tolerations) that a type and the
deployment (TASK_RESOURCES, …) both give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from functions.errors import ConfigError
from functions.model import ResourceType
from functions.setting_values import DNS_SUBDOMAIN, QUANTITY

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
        spec.build_size_limit and not QUANTITY.match(spec.build_size_limit)
    ):
        raise ConfigError(f"{where}.build_size_limit must be a Kubernetes quantity such as 8Gi")
    if spec.check_every is not None and not is_seconds(spec.check_every):
        raise ConfigError(f"{where}.check_every must be a number of seconds, 0 or more")
    pull = spec.image_pull_secrets
    if not isinstance(pull, list) or not all(
        isinstance(n, str) and DNS_SUBDOMAIN.match(n) for n in pull
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
