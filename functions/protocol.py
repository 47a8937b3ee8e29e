"""The Concourse resource protocol as pure functions: what goes in, what must come out.

stdin is one JSON object with exactly the keys Concourse sends; stdout's first JSON value
is the answer; everything else a script prints is ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

from functions.model import Action, Build, TraceContext
from functions.tracing import trace_env

MAX_STDOUT_BYTES = 8 * 1024 * 1024  # only the first JSON value counts: the head is kept
MAX_STDERR_BYTES = 4 * 1024 * 1024  # the log keeps the tail: that is where errors are
MAX_STDIN_BYTES = 2 * 1024 * 1024  # a Secret holds at most 1 MiB
# Metadata goes into every reply, the cache record and the history: well under the reply
# relay's 4 MiB per event, far over what resources print (a commit message, a digest, URLs).
MAX_METADATA_BYTES = 1024 * 1024
METADATA_KEYS = ("name", "value")


class InvalidOutput(ValueError):
    """The script exited 0 but its stdout breaks the protocol; the message quotes why."""


def stdin_payload(
    action: Action, source: dict[str, Any], version: dict[str, str] | None, params: dict[str, Any]
) -> bytes:
    """The script's stdin: check {source, version}, in {source, version, params},
    out {source, params}; ``params`` omitted when empty, nothing else added."""
    body: dict[str, Any] = {"source": source}
    if action in ("check", "get"):
        body["version"] = version
    if action in ("get", "put") and params:
        body["params"] = params
    return go_json(body)


_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def go_json(value: Any) -> bytes:
    """``value`` encoded as Go's encoding/json (what Concourse sends) encodes it: UTF-8, no
    ``\\u`` escapes for non-ASCII text except U+2028/U+2029, ``<``, ``>`` and ``&`` escaped,
    invalid text (a lone surrogate) replaced by U+FFFD."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = _GO_ESCAPED.sub(lambda m: _GO_ESCAPES[m.group()], text)
    return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def build_env(action: Action, build: Build, trace: TraceContext | None = None) -> dict[str, str]:
    """The BUILD_* metadata env of in/out scripts (check gets none), and for every action
    the request's trace context (TRACEPARENT, TRACESTATE) if it had one. Nothing secret:
    ``source`` and ``params`` never go into env vars."""
    if action == "check":
        return trace_env(trace)
    return {
        **trace_env(trace),
        "BUILD_ID": build.id,
        "BUILD_NAME": build.name,
        "BUILD_JOB_NAME": build.job,
        "BUILD_PIPELINE_NAME": build.pipeline,
        "BUILD_TEAM_NAME": build.team,
        "BUILD_PIPELINE_INSTANCE_VARS": build.instance_vars,
        "ATC_EXTERNAL_URL": build.external_url,
        "BUILD_URL": build.url,
    }


def first_json_value(stdout: bytes) -> Any:
    """Decode the first JSON value on stdout; trailing output is ignored, as Concourse does."""
    if len(stdout) > MAX_STDOUT_BYTES:
        raise InvalidOutput(f"stdout is larger than {MAX_STDOUT_BYTES} bytes")
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidOutput(f"stdout is not UTF-8 ({err.reason} at byte {err.start})") from None
    stripped = text.lstrip()
    if not stripped:
        raise InvalidOutput("stdout is empty: expected a JSON value")
    try:
        value, _ = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as err:
        # Position only: quoting stdout could copy a credential the script printed.
        raise InvalidOutput(
            f"stdout is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    return value


def parse_check_output(stdout: bytes) -> list[dict[str, str]]:
    """Versions printed by check, oldest first; ``null`` means no versions."""
    value = first_json_value(stdout)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidOutput(f"check must print a JSON list of versions, got {_kind(value)}")
    return [check_version(item, f"versions[{i}]") for i, item in enumerate(value)]


def parse_version_output(stdout: bytes) -> tuple[dict[str, str], list[dict[str, str]]]:
    """``{"version": {...}, "metadata": [...]}`` printed by in/out."""
    value = first_json_value(stdout)
    if not isinstance(value, dict):
        raise InvalidOutput(f"expected a JSON object with a version, got {_kind(value)}")
    if "version" not in value:
        raise InvalidOutput("output has no 'version'")
    version = check_version(value["version"], "version")
    metadata = check_metadata(value.get("metadata"))
    return version, metadata


def check_version(value: Any, where: str) -> dict[str, str]:
    """A version is a flat map of strings to strings."""
    if not isinstance(value, dict):
        raise InvalidOutput(f"{where} must be an object of strings, got {_kind(value)}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidOutput(f"{where}.{key} must be a string, got {_kind(item)}")
    return value


def check_metadata(value: Any) -> list[dict[str, str]]:
    """Metadata is a list of {"name", "value"} string pairs; absent or null means none. A
    field's other string members are kept as given (git-resource's ``"type": "time"``; a
    consumer of the replies may use them, where Concourse drops every other member), the
    rest dropped. At most ``MAX_METADATA_BYTES`` of JSON."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidOutput(f"metadata must be a list, got {_kind(value)}")
    for i, item in enumerate(value):
        ok = isinstance(item, dict) and isinstance(item.get("name"), str)
        if not ok or not isinstance(item.get("value", ""), str):
            raise InvalidOutput(f'metadata[{i}] must be {{"name": str, "value": str}}')
    fields = [
        {
            "name": item["name"],
            "value": item.get("value", ""),
            **{k: v for k, v in item.items() if k not in METADATA_KEYS and isinstance(v, str)},
        }
        for item in value
    ]
    size = len(json.dumps(fields, ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise InvalidOutput(f"metadata is {size} bytes of JSON, over {MAX_METADATA_BYTES}")
    return fields


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), "a value")
