"""A CustomRun's params as the request data the functions take (pure functions).

The public interface (docs/tekton.md): ``customRef`` ``resource-functions.dev/v1alpha1``,
kinds ``Check``, ``Get``, ``Put``; params ``type`` or ``image`` (strings), ``source``,
``params``, ``version`` and (Put) ``inputs`` as JSON text. A bad param is reported naming
it, before any request is posted: the semantic checks are the services' own
(``parse_request_data``), so a CustomRun the controller accepts is one the services accept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.errors import InvalidRequest
from functions.model import Action, ResourceType
from functions.request_data import (
    MAX_DEPTH,
    image_allowed,
    image_refusal,
    parse_request_data,
)

API_VERSION = "resource-functions.dev/v1alpha1"
ACTIONS: dict[str, Action] = {"Check": "check", "Get": "get", "Put": "put"}
TEXT_PARAMS = ("type", "image")
JSON_PARAMS = {
    "check": ("source", "version"),
    "get": ("source", "version", "params"),
    "put": ("source", "params", "inputs"),
}


# A param's JSON text is judged before it is parsed: no larger than this, nested no deeper than
# the functions take.
MAX_PARAM_BYTES = 256 * 1024
# All params together: a CustomRun whose params fit stays well inside the controller's bound
# on an object (functions/kube/tekton_api.py BOUNDS: 512 KiB), status and metadata included.
MAX_PARAMS_BYTES = 384 * 1024


class BadParams(ValueError):
    """The CustomRun cannot become a request; the message names each param at fault."""


@dataclass(frozen=True)
class RunRequest:
    """What one CustomRun asks the functions for: the ``action`` and the request ``data``
    (source and params included: held in memory only, never logged)."""

    action: Action
    data: dict[str, Any]


def custom_ref(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """The CustomRun's ``customRef``, or its ``customSpec`` (which has the same two fields)."""
    spec = run.get("spec") or {}
    return spec.get("customRef") or spec.get("customSpec") or {}


def is_ours(run: Mapping[str, Any]) -> bool:
    return custom_ref(run).get("apiVersion") == API_VERSION


def action_of(run: Mapping[str, Any]) -> Action:
    kind = custom_ref(run).get("kind")
    if kind not in ACTIONS:
        raise BadParams(f"kind {kind!r} is not one of {', '.join(ACTIONS)} ({API_VERSION})")
    return ACTIONS[kind]


def run_request(
    run: Mapping[str, Any],
    *,
    resource_types: Mapping[str, ResourceType],
    artifact_url_prefix: str,
    allowed_images: tuple[str, ...] = ("*",),
) -> RunRequest:
    """The request of CustomRun ``run`` (without ``build``, which ``decide`` adds), or
    ``BadParams`` listing every problem; an explicit ``image`` must match ``allowed_images``
    (the functions' ``ALLOWED_IMAGES``), as the functions would refuse it after the post."""
    action = action_of(run)
    given = params_of(run)
    problems: list[str] = []
    total = sum(len(v) for v in given.values() if isinstance(v, str))
    if total > MAX_PARAMS_BYTES:
        raise BadParams(f"the params hold {total} bytes of text, more than {MAX_PARAMS_BYTES}")
    known = (*TEXT_PARAMS, *JSON_PARAMS[action])
    unknown = sorted(set(given) - set(known))
    if unknown:
        problems.append(
            f"unknown param(s) for {action}: {', '.join(unknown)} (known: {', '.join(known)})"
        )
    data: dict[str, Any] = {}
    for name in TEXT_PARAMS:
        if name in given:
            value = given[name]
            if isinstance(value, str) and value:
                data[name] = value
            else:
                problems.append(f"param {name!r} must be a non-empty string")
    for name in JSON_PARAMS[action]:
        if name in given:
            parsed = json_param(name, given[name], problems)
            if parsed is not None:
                data[name] = parsed
    data.setdefault("source", {})
    if isinstance(data.get("inputs"), dict):
        data["inputs"] = as_inputs(data["inputs"])
    if problems:
        raise BadParams("; ".join(problems))
    try:
        parse_request_data(
            data,
            action=action,
            event={"id": "-", "source": "-"},
            resource_types=resource_types,
            artifact_url_prefix=artifact_url_prefix,
            reply_async=True,
        )
    except InvalidRequest as err:
        raise BadParams("; ".join(err.problems)) from None
    image = data.get("image")
    if isinstance(image, str) and not image_allowed(image, allowed_images):
        raise BadParams(image_refusal(image))
    return RunRequest(action, data)


def params_of(run: Mapping[str, Any]) -> dict[str, Any]:
    """The CustomRun's params by name (Tekton has validated their names, not their values)."""
    listed = (run.get("spec") or {}).get("params") or []
    return {p["name"]: p.get("value") for p in listed if isinstance(p, dict) and "name" in p}


def json_param(name: str, value: Any, problems: list[str]) -> Any:
    """Param ``name``'s JSON text as a value (None and a problem when it is not JSON)."""
    if not isinstance(value, str):
        problems.append(
            f"param {name!r} must be a string holding JSON, got a {type(value).__name__}"
        )
        return None
    if len(value) > MAX_PARAM_BYTES:
        problems.append(f"param {name!r} is {len(value)} bytes, more than {MAX_PARAM_BYTES}")
        return None
    if nesting(value) > MAX_DEPTH:
        problems.append(f"param {name!r} is nested deeper than {MAX_DEPTH} levels")
        return None
    try:
        return json.loads(value)
    except ValueError as err:
        problems.append(f"param {name!r} is not valid JSON: {err}")
        return None


def nesting(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text, outside strings, read without
    parsing (the parser recurses: 5,000 levels raise ``RecursionError``)."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def as_inputs(value: dict[str, Any]) -> dict[str, Any]:
    """A Put's ``inputs``: each a Get's ``artifact`` result (``{"url", "digest", "size",
    "format"}``: the digest is verified when staged) or an artifact URL, as the put takes
    them (``{"url", "digest"}`` or the URL)."""
    return {
        name: {k: v for k, v in spec.items() if k in ("url", "digest")}
        if isinstance(spec, dict)
        else spec
        for name, spec in value.items()
    }
