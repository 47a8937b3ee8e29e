"""The value of one setting, read from its variable's text: a typed value, or a
``ConfigError`` naming the variable (``functions.settings`` reads them all at once).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import TypeVar

from functions.errors import ConfigError
from functions.redaction import DEFAULT_REDACT_KEYS
from storage.tuning import env_int

T = TypeVar("T")


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


def storage_setting(read: Callable[[Mapping[str, str]], T], env: Mapping[str, str]) -> T:
    """The storage layer's own settings; their ValueError becomes a ConfigError."""
    try:
        return read(env)
    except ValueError as err:
        raise ConfigError(str(err)) from None


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def quantity(env: Mapping[str, str], name: str, default: str) -> str:
    """A Kubernetes quantity (e.g. 8Gi); empty: none (no limit)."""
    value = env.get(name, default).strip()
    if value and not QUANTITY.match(value):
        raise ConfigError(f"{name}={value!r}: expected a Kubernetes quantity such as 8Gi")
    return value


def dns_name(env: Mapping[str, str], name: str) -> str:
    value = (env.get(name) or "").strip()
    if value and not DNS_SUBDOMAIN.match(value):
        raise ConfigError(f"{name}={value!r}: expected a Kubernetes object name")
    return value


def name_list(env: Mapping[str, str], name: str) -> list[str]:
    """A comma-separated list of Kubernetes object names ('' means none)."""
    names = [item.strip() for item in (env.get(name) or "").split(",") if item.strip()]
    for item in names:
        if not DNS_SUBDOMAIN.match(item):
            raise ConfigError(f"{name}: {item!r} is not a Kubernetes object name")
    return names


def text(env: Mapping[str, str], name: str, default: str = "") -> str:
    """The variable's text, stripped; ``default`` if that is empty."""
    return env.get(name, "").strip() or default


def choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = (env.get(name) or default).strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def number(env: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
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


def whole(env: Mapping[str, str], name: str, default: int) -> int:
    value = storage_setting(partial(env_int, name=name, default=default), env)
    if value < 1:
        raise ConfigError(f"{name}={value}: expected a positive whole number")
    return value
