"""Validation of request data into a ``Request``: every problem found is reported at once."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from typing import Any

from functions import keys
from functions.errors import InvalidRequest
from functions.ledger.history import LATEST_KNOWN
from functions.model import Action, ArtifactRef, Build, Request, ResourceType
from functions.resource_types import is_seconds
from storage.archive import FORMATS, suffix_for
from storage.base import is_digest, key_problem

BUILD_FIELDS = ("id", "name", "job", "pipeline", "team", "url", "external_url", "instance_vars")
ALLOWED_KEYS = {
    # build: team, pipeline for ((var)); check_every: seconds, answered from history within
    "check": {"type", "image", "source", "version", "build", "check_every"},
    "get": {"type", "image", "source", "version", "params", "build"},
    "put": {"type", "image", "source", "params", "inputs", "build"},
}
# An input name becomes a directory under the put's working directory.
INPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ARTIFACT_SUFFIXES = tuple(suffix_for(f) for f in FORMATS)
MAX_ATTRIBUTE = 1024  # event id, source, subject
MAX_TEXT = 4096  # each build field, each input URL
MAX_DEPTH = 64  # nesting levels of source, params, version and build.instance_vars
MAX_INPUTS = 64  # inputs of one put
INPUT_FIELDS = {"url", "digest"}
# Image references: registry/repo[:tag][@sha256:hex]; no whitespace or shell characters.
IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*[a-zA-Z0-9._-]$", re.IGNORECASE)


def parse_request_data(
    data: Any,
    *,
    action: Action,
    event: Mapping[str, Any],
    resource_types: Mapping[str, ResourceType],
    artifact_url_prefix: str,
    reply_async: bool,
) -> Request:
    """Validate ``data`` for ``action``; raise ``InvalidRequest`` listing every problem."""
    if not isinstance(data, dict):
        raise InvalidRequest("data must be a JSON object")
    problems: list[str] = []
    unknown = sorted(set(data) - ALLOWED_KEYS[action])
    if unknown:
        problems.append(f"unknown field(s) for {action}: {', '.join(unknown)}")
    resource_type, type_name = _resource_type(data, resource_types, problems)
    source = _object(data, "source", problems, required=True)
    latest_known = action == "check" and data.get("version") == LATEST_KNOWN
    version = None if latest_known else _version(data, action, problems)
    check_every = _check_every(data, problems)
    params = _object(data, "params", problems, required=False)
    inputs = _inputs(data, action, artifact_url_prefix, problems)
    build = _build(data.get("build"), problems)
    _check_sizes(event, build, problems)
    _check_depth(data, problems)
    if problems:
        raise InvalidRequest(*problems)
    assert resource_type is not None
    return Request(
        action=action,
        event_id=str(event["id"]),
        event_source=str(event["source"]),
        subject=event.get("subject"),
        resource_type=resource_type,
        type_name=type_name,
        source=source,
        version=version,
        params=params,
        inputs=inputs,
        build=build,
        reply_async=reply_async,
        latest_known=latest_known,
        check_every=check_every,
    )


def _resource_type(
    data: dict[str, Any], catalogue: Mapping[str, ResourceType], problems: list[str]
) -> tuple[ResourceType | None, str | None]:
    name, image = data.get("type"), data.get("image")
    if (name is None) == (image is None):
        problems.append("exactly one of 'type' (a catalogue name) or 'image' is required")
        return None, None
    if name is not None:
        if not isinstance(name, str) or name not in catalogue:
            known = ", ".join(sorted(catalogue)) or "none configured"
            problems.append(f"type {_clip(name)} is not in the catalogue (known: {known})")
            return None, None
        return catalogue[name], name
    if not isinstance(image, str) or len(image) > 512 or not IMAGE_REF.match(image):
        problems.append(f"image {_clip(image)} is not a valid image reference")
        return None, None
    return ResourceType(image=image), None


def _object(
    data: dict[str, Any], key: str, problems: list[str], *, required: bool
) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        if required:
            problems.append(f"'{key}' is required (a JSON object)")
        return {}
    if not isinstance(value, dict):
        problems.append(f"'{key}' must be a JSON object")
        return {}
    return value


def _version(data: dict[str, Any], action: Action, problems: list[str]) -> dict[str, str] | None:
    value = data.get("version")
    if value is None:
        if action == "get":
            problems.append("'version' is required for get (an object of strings)")
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        also = f" or {LATEST_KNOWN!r} (continue from the history)" if action == "check" else ""
        problems.append(f"'version' must be an object mapping strings to strings{also}")
        return None
    return value


def _check_every(data: dict[str, Any], problems: list[str]) -> float | None:
    value = data.get("check_every")
    if value is not None and not is_seconds(value):
        problems.append("'check_every' must be a number of seconds, 0 or more")
        return None
    return None if value is None else float(value)


def _inputs(
    data: dict[str, Any], action: Action, prefix: str, problems: list[str]
) -> dict[str, ArtifactRef]:
    """put inputs: name -> artifact URL, or name -> {"url", "digest"} to verify the bytes."""
    value = data.get("inputs")
    if action != "put" or value is None:
        return {}
    if not isinstance(value, dict):
        problems.append("'inputs' must be an object mapping input names to artifact URLs")
        return {}
    if len(value) > MAX_INPUTS:
        problems.append(f"a put takes at most {MAX_INPUTS} inputs, got {len(value)}")
        return {}
    refs: dict[str, ArtifactRef] = {}
    for name, spec in value.items():
        if not INPUT_NAME.match(name):
            problems.append(f"input name {_clip(name)} must match {INPUT_NAME.pattern}")
        unknown = sorted(set(spec) - INPUT_FIELDS) if isinstance(spec, dict) else []
        if unknown:
            problems.append(
                f"input {_clip(name)}: unknown field(s) "
                f"{', '.join(_clip(k) for k in unknown)} (known: digest, url)"
            )
            continue
        url, digest = (
            (spec.get("url"), spec.get("digest")) if isinstance(spec, dict) else (spec, None)
        )
        if not isinstance(url, str) or not _is_artifact_url(url, prefix):
            problems.append(
                f"input {_clip(name)}: URL must be an artifact in this store "
                f"({prefix}<name>{'|'.join(ARTIFACT_SUFFIXES)})"
            )
        elif digest is not None and not is_digest(digest):
            problems.append(f"input {name!r}: digest must be 'sha256:' and 64 hex digits")
        else:
            refs[name] = ArtifactRef(key=keys.ARTIFACTS + url[len(prefix) :], digest=digest)
    return refs


def _is_artifact_url(url: str, prefix: str) -> bool:
    if not url.startswith(prefix) or len(url) > MAX_TEXT:
        return False
    name = url[len(prefix) :]
    return key_problem(keys.ARTIFACTS + name) is None and name.endswith(ARTIFACT_SUFFIXES)


def image_allowed(image: str, allowed: tuple[str, ...]) -> bool:
    """Whether an explicit ``image`` matches a glob of ``ALLOWED_IMAGES``."""
    return any(fnmatch.fnmatchcase(image, pattern) for pattern in allowed)


def image_refusal(image: str) -> str:
    return f"image {image!r} is not allowed here (ALLOWED_IMAGES); use a catalogue type"


def _clip(value: Any) -> str:
    """repr of a rejected value, short: it is echoed into the 400 body and the log."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_depth(data: dict[str, Any], problems: list[str]) -> None:
    """Deep nesting serves no resource and breaks recursive code downstream: refuse it."""
    for key in ("source", "params", "version", "build"):
        if _depth(data.get(key)) > MAX_DEPTH:
            problems.append(f"'{key}' is nested deeper than {MAX_DEPTH} levels")


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0, ``{}`` is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _check_sizes(event: Mapping[str, Any], build: Build, problems: list[str]) -> None:
    """Event ids and build fields become env vars, args and annotations: keep them small."""
    for name in ("id", "source", "subject"):
        if len(str(event.get(name) or "")) > MAX_ATTRIBUTE:
            problems.append(f"event attribute {name!r} is longer than {MAX_ATTRIBUTE} characters")
    for name in BUILD_FIELDS:
        if len(getattr(build, name)) > MAX_TEXT:
            problems.append(f"build.{name} is longer than {MAX_TEXT} characters")


def _build(value: Any, problems: list[str]) -> Build:
    if value is None:
        return Build()
    if not isinstance(value, dict):
        problems.append("'build' must be a JSON object")
        return Build()
    unknown = sorted(set(value) - set(BUILD_FIELDS))
    if unknown:
        problems.append(f"unknown build field(s): {', '.join(unknown)}")
    fields: dict[str, str] = {}
    for key in BUILD_FIELDS:
        item = value.get(key, "")
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            item = str(item)
        elif key == "instance_vars" and isinstance(item, dict):
            item = json.dumps(item, sort_keys=True, separators=(",", ":"))
        if not isinstance(item, str):
            problems.append(f"build.{key} must be a string")
            continue
        fields[key] = item
    return Build(**fields)
