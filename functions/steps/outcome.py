"""Turning what a script did (exit code, stdout, stderr) into an ``Outcome`` (pure).

A non-zero exit is a *result* (``resource_failed``), malformed stdout is ``invalid_output``;
neither is an error of this system.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from functions.errors import classify, unavailable
from functions.model import Action, Failure, FailureKind, Outcome
from functions.protocol import (
    METADATA_KEYS,
    InvalidOutput,
    parse_check_output,
    parse_version_output,
)
from functions.redaction import Redactor

LOG_TAIL_BYTES = 2048


def screened(outcome: Outcome, redactor: Redactor, credentials: Redactor, log: str) -> Outcome:
    """The outcome as it may be stored and replied: secrets (``redactor``) out of its
    failure message and its metadata; a version that holds a resolved credential value
    (``credentials``, in any form it knows) is ``invalid_output`` naming the field, because
    versions go to the history and to events as they are. ``log``: redacted already."""
    if outcome.failure is not None:
        message = redactor.redact_text(outcome.failure.message)
        return replace(outcome, failure=replace(outcome.failure, message=message))
    data = outcome.data or {}
    for where in secret_fields(data, credentials):
        message = (
            f"invalid output: {where} holds a credential (versions are stored in the history "
            "and sent in events, so none may hold one in any form)"
        )
        failure = Failure("invalid_output", message, exit_code=0, log_tail=log_tail(log) or None)
        return Outcome(action=outcome.action, failure=failure)
    if "metadata" in data:
        metadata = [redacted_field(field, redactor) for field in data["metadata"]]
        return replace(outcome, data={**data, "metadata": metadata})
    return outcome


def redacted_field(field: dict[str, str], redactor: Redactor) -> dict[str, str]:
    """A metadata field with secrets out of its values, and of the names of members other
    than ``name`` and ``value`` (a resource chooses those too)."""
    return {
        (k if k in METADATA_KEYS else redactor.redact_text(k)): redactor.redact_text(v)
        for k, v in field.items()
    }


def secret_fields(data: dict[str, Any], redactor: Redactor) -> Iterator[str]:
    """Where the reply data's versions hold a value of ``redactor``, as ``version field
    "ref"`` (the field's name redacted too, never a value)."""
    if not redactor:
        return
    versions = enumerate(data.get("versions", []))
    named = [(f"versions[{i}]", v) for i, v in versions] + [("version", data.get("version"))]
    for where, version in named:
        for key, value in (version or {}).items():
            if redactor.finds(key) or redactor.finds(value):
                yield f'{where} field "{redactor.redact_text(key)}"'


def log_tail(log: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a log for a reply, progress bars collapsed so the error line shows."""
    log = last_states(log)
    tail = log[-limit:]
    return tail if len(log) <= limit else "…" + tail.split("\n", 1)[-1]


def last_states(log: str) -> str:
    """Each line as a terminal would leave it: a carriage return (``git clone --progress``,
    curl, pip) redraws its line, so only the last non-empty state counts. Stored logs keep
    every state; tails are short and must show the error, not 90% of redraws."""
    if "\r" not in log:
        return log
    lines = []
    for line in log.split("\n"):
        states = [state for state in line.split("\r") if state]
        lines.append(states[-1] if states else "")
    return "\n".join(lines)


def script_failure(exit_code: int, log: str) -> Failure:
    return Failure(
        kind="resource_failed",
        message=f"the resource script exited with code {exit_code}",
        exit_code=exit_code,
        log_tail=log_tail(log) or None,
    )


def parse_output(action: Action, stdout: bytes) -> dict[str, Any]:
    """Reply data from a successful script's stdout; raises ``InvalidOutput``."""
    if action == "check":
        return {"versions": parse_check_output(stdout)}
    version, metadata = parse_version_output(stdout)
    return {"version": version, "metadata": metadata}


def outcome_of_script(action: Action, exit_code: int, stdout: bytes, log: str) -> Outcome:
    """The outcome before any artifact is stored: failure, or data without ``artifact``."""
    if exit_code != 0:
        return Outcome(action=action, failure=script_failure(exit_code, log))
    try:
        return Outcome(action=action, data=parse_output(action, stdout))
    except InvalidOutput as err:
        failure = Failure(
            kind="invalid_output",
            message=f"invalid output: {err}",
            exit_code=0,
            log_tail=log_tail(log) or None,
        )
        return Outcome(action=action, failure=failure)


def failed(action: Action, kind: FailureKind, message: str, log: str = "") -> Outcome:
    return Outcome(
        action=action, failure=Failure(kind=kind, message=message, log_tail=log_tail(log) or None)
    )


def final_failure(action: Action, err: Exception) -> Outcome:
    """THE mapping of an error to a reply (``errors.classify``): a retryable one raises
    ``Unavailable`` (HTTP 503, Knative redelivers); a permanent one is the request's final
    ``…failed`` outcome (200)."""
    verdict = classify(err)
    if verdict.retryable:
        raise unavailable(err) from err
    return failed(action, verdict.kind, verdict.message)


def script_timeout(action: Action, seconds: float | None, log: str = "") -> Outcome:
    """The failure of a script stopped at its timeout (``seconds``; None: not known), the
    same whichever runtime stopped it."""
    limit = f"{seconds:g}s" if seconds is not None else "its timeout"
    return failed(action, "timeout", f"the resource script ran longer than {limit}", log)


def task_deadline(action: Action, deadline: int, timeout: float, margin: float) -> Outcome:
    """The failure of a task pod that outlived its Job's deadline (the function saw it)."""
    return failed(
        action,
        "timeout",
        (
            f"the task ran longer than {deadline}s (the resource's {timeout:g}s + {margin:g}s to "
            "stage and collect)"
        ),
    )
