"""The CustomRun status this controller writes (pure functions of the old status and time).

Tekton reads only the ``Succeeded`` condition (True/False: done; Unknown: running) and, for
counting, the reason ``CustomRunCancelled``; results are read once the run is done, so they
are written in the same patch as ``True``. Unknown top-level status fields are pruned by the
CRD: what the controller keeps of its own goes under ``extraFields``.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

SUCCEEDED = "Succeeded"
RUNNING = "Running"
RETRYING = "Retrying"
CANCELLED = "CustomRunCancelled"
TIMED_OUT = "CustomRunTimedOut"
BAD_PARAMS = "InvalidParams"
REFUSED = "RequestRefused"  # the Broker refused the controller's post for good
UNDECODABLE = "Undecodable"  # too deep or too large for the controller to read
TEAM_CHANGED = "TeamChanged"  # the namespace's team changed while an attempt ran
MAX_MESSAGE = 3000  # a condition message stays readable in `kubectl describe`


def timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def condition_of(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == SUCCEEDED), None)


def is_done(status: dict[str, Any]) -> bool:
    found = condition_of(status)
    return found is not None and found.get("status") in ("True", "False")


def attempt_of(status: dict[str, Any]) -> int:
    """The attempt under way: 0 for the first, N for the Nth retry (Tekton counts retries
    as ``len(retriesStatus)``)."""
    return len(status.get("retriesStatus") or [])


def with_condition(
    status: dict[str, Any], state: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """``status`` with its Succeeded condition set (lastTransitionTime kept when the state
    does not change) and, when done, its completionTime."""
    new = copy.deepcopy(status)
    old = condition_of(status) or {}
    moved = old.get("status") != state
    new["conditions"] = [
        {
            "type": SUCCEEDED,
            "status": state,
            "reason": reason,
            "message": clip(message),
            "lastTransitionTime": timestamp(now) if moved else old.get("lastTransitionTime"),
        }
    ]
    if state != "Unknown":
        new["completionTime"] = timestamp(now)
    return new


def started(status: dict[str, Any], request_id: str, team: str, now: datetime) -> dict[str, Any]:
    """An attempt begins: its start time (the timeout counts from it), its request id and
    the team it runs for (its stop and its reply are that team's, whatever the namespace
    says later)."""
    new = with_condition(status, "Unknown", RUNNING, f"request {request_id} posted", now)
    new["startTime"] = timestamp(now)
    extra = status.get("extraFields") or {}
    new["extraFields"] = {**extra, "requestId": request_id, "team": team}
    return new


def team_of_attempt(status: dict[str, Any]) -> str | None:
    """The team the attempt under way was posted for (None for one started before the
    controller recorded it)."""
    team = (status.get("extraFields") or {}).get("team")
    return team if isinstance(team, str) and team else None


def retried(
    status: dict[str, Any],
    reason: str,
    message: str,
    next_request: str,
    team: str,
    now: datetime,
) -> dict[str, Any]:
    """The attempt under way failed with retries left: a copy of it, failed, joins
    ``retriesStatus`` and the next attempt starts (Unknown, reason Retrying)."""
    failed = with_condition(
        {k: v for k, v in status.items() if k != "retriesStatus"}, "False", reason, message, now
    )
    new = started(status, next_request, team, now)
    new["retriesStatus"] = [*(status.get("retriesStatus") or []), failed]
    new["conditions"][0]["reason"] = RETRYING
    new["conditions"][0]["message"] = clip(f"attempt {attempt_of(status) + 1} failed: {message}")
    return new


def finished(
    status: dict[str, Any],
    succeeded: bool,
    reason: str,
    message: str,
    now: datetime,
    results: dict[str, str] | None = None,
) -> dict[str, Any]:
    new = with_condition(status, "True" if succeeded else "False", reason, message, now)
    new.setdefault("startTime", timestamp(now))
    if results:
        new["results"] = [{"name": k, "value": v} for k, v in results.items()]
    return new


def results_of(action: str, data: dict[str, Any]) -> dict[str, str]:
    """A succeeded reply's data as the CustomRun's results: JSON text each (Tekton results
    are strings). ``versions`` is a list of objects, never a list of strings, so Tekton keeps
    it a string param too."""

    def text(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    if action == "check":
        return {"versions": text(data.get("versions") or [])}
    found = {
        "version": text(data.get("version") or {}),
        "metadata": text(data.get("metadata") or []),
    }
    if action == "get":
        found["artifact"] = text(data.get("artifact") or {})
    return found


def failure_reason(kind: str) -> str:
    """A failure kind of the event contract as a condition reason: ``resource_failed`` →
    ``ResourceFailed``."""
    return "".join(part.capitalize() for part in kind.split("_")) or "Failed"


def failure_message(action: str, error: dict[str, Any]) -> str:
    """A failed reply's error as a readable message: its kind, message, exit code and the
    (already redacted) end of the log, cut from the front so the end stays."""
    kind = error.get("kind") or "unknown"
    text = f"{action} failed ({kind}): {error.get('message') or ''}".rstrip()
    if error.get("exit_code") is not None:
        text += f" [exit code {error['exit_code']}]"
    tail = error.get("log_tail") or ""
    if tail:
        room = max(200, MAX_MESSAGE - len(text) - 20)
        text += "\nlog tail:\n" + (tail if len(tail) <= room else "…" + tail[-room:])
    return text


def clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"
