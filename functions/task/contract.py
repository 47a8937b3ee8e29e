"""The task pod's contract: what the function, both runtimes and the in-pod steps (``stage``,
``collect``) agree on. Paths, file names, env names, exit codes and the timeout failure are
spelled here and nowhere else, and so is the reply event that both the function and
``collect`` send (the same run gives the same event id, so a consumer can drop the double).

Layout of the shared build volume (``BUILD_DIR``)::

    /tmp/build/put/NAME         a put's inputs (stage unpacks them), its working directory
    /tmp/build/get/             a get's output directory
    /tmp/build/.task/           what the resource step leaves for collect:
        stage-error             stage's message when an input is missing or unsafe
        stdout, stderr          the script's output streams
        exit-code               the script's exit code (TIMED_OUT_EXIT_CODE after a timeout)
        timed-out               the timeout in whole seconds, if the watchdog stopped it
    /secret/stdin               the stdin payload (a Secret), read by resource and collect
    /secret/redact              resolved credential values (JSON list), for collect to redact
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from functions.events import TYPE_PREFIX
from functions.keys import canonical_json
from functions.model import Action, ArtifactRef, HistoryPlan, Outcome, TraceContext
from functions.outcome import failed
from functions.tracing import trace_attributes
from storage.base import is_digest

MANAGED_BY = "resource-functions"  # the managed-by label of task Jobs and local containers
BUILD_DIR = "/tmp/build"
TASK_SUBDIR = ".task"
TASK_DIR = f"{BUILD_DIR}/{TASK_SUBDIR}"
SECRET_DIR = "/secret"
STDIN_KEY = "stdin"
STDIN_FILE = f"{SECRET_DIR}/{STDIN_KEY}"
# Beside stdin in the same Secret: a JSON list of the resolved credential values, which
# collect redacts whatever their length (they are all in stdin already).
REDACT_KEY = "redact"
STAGE_ERROR_FILE = "stage-error"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
EXIT_CODE_FILE = "exit-code"
TIMED_OUT_FILE = "timed-out"  # holding the timeout: the watchdog stopped the script
TIMED_OUT_EXIT_CODE = 124
KILL_AFTER_SECONDS = 2  # from SIGTERM to SIGKILL when the script overruns

MAX_STDERR_BYTES = 4 * 1024 * 1024  # the log keeps the tail: that is where errors are
MAX_STDIN_BYTES = 2 * 1024 * 1024  # a Secret holds at most 1 MiB

# A step that cannot reach the store exits EX_TEMPFAIL, its termination message starting
# with the marker: the function deletes the Job and answers 503 (job_status: "unavailable").
EXIT_UNAVAILABLE = 75
UNAVAILABLE_MARKER = "unavailable:"

# The env of stage/collect: the store and the sink (collect only, the function's own K_SINK);
# the non-secret settings they also get from the function are ``functions.settings.STEP_ENV``.
STORE_URL_ENV = "STORE_URL"
SINK_ENV = "K_SINK"

# Past a task Job's deadline the function waits DEADLINE_SLACK_SECONDS before it judges the
# task timed out (a pod's end takes a moment to show), and up to RESULT_WAIT_SECONDS for the
# result of a completed Job. LEASE_SPARE_SECONDS: creating the Job, and replicas' clocks.
DEADLINE_SLACK_SECONDS = 30.0
RESULT_WAIT_SECONDS = 10.0
LEASE_SPARE_SECONDS = 30.0

REPLY_SOURCE = "/resource-functions/{action}"
DISCOVERED_TYPE = f"{TYPE_PREFIX}version.discovered"


@dataclass(frozen=True)
class ReplyPlan:
    """Asynchronous completion: ``collect`` posts the reply event to ``$K_SINK`` itself."""

    request_id: str
    subject: str | None = None
    sink: str = ""  # the function's own K_SINK: given to the collect container alone
    trace: TraceContext | None = None  # the request's, carried on by the posted events


def format_input(name: str, ref: ArtifactRef) -> str:
    """The ``--input`` argument of the stage step: ``NAME=KEY[@sha256:HEX]``."""
    return f"{name}={ref.key}@{ref.digest}" if ref.digest else f"{name}={ref.key}"


def parse_input(value: str) -> tuple[str, ArtifactRef]:
    """Inverse of ``format_input``; ``ValueError`` says what is wrong."""
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--input {value!r}: expected NAME=KEY[@sha256:HEX]")
    key, at, digest = rest.rpartition("@")
    if at and is_digest(digest):
        return name, ArtifactRef(key=key, digest=digest)
    return name, ArtifactRef(key=rest)


def script_timeout(action: Action, seconds: float | None, log: str = "") -> Outcome:
    """The failure of a script stopped at its timeout (``seconds``; None: not known), the
    same whichever runtime stopped it."""
    limit = f"{seconds:g}s" if seconds is not None else "its timeout"
    return failed(action, "timeout", f"the resource script ran longer than {limit}", log)


def deadline_seconds(timeout: float, margin: float) -> int:
    """A task's whole budget (the Job's ``activeDeadlineSeconds``): the script's ``timeout``
    plus the ``margin`` for image pulls, stage and collect; whole seconds."""
    return max(1, math.ceil(timeout + margin))


def async_lease_seconds(timeout: float, margin: float) -> float:
    """How long an asynchronous check's lease lasts. Nobody renews it while the task runs
    (the service answered 202 and may be gone), so it outlasts the whole task: its deadline,
    the function's slack past it and its wait for the result (a failure collect never saw is
    recorded, and the lease released, only then), and a spare for starting it."""
    return (
        deadline_seconds(timeout, margin)
        + DEADLINE_SLACK_SECONDS
        + RESULT_WAIT_SECONDS
        + LEASE_SPARE_SECONDS
    )


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


def reply_type(action: str, succeeded: bool) -> str:
    return f"{TYPE_PREFIX}{action}.{'succeeded' if succeeded else 'failed'}"


def reply_event(
    *,
    action: Action,
    outcome: Outcome,
    request_id: str,
    subject: str | None,
    run_id: str,
    trace: TraceContext | None = None,
) -> CloudEvent:
    """The reply CloudEvent for an outcome (pure: same inputs, same event but for ``time``).
    ``trace``: the request's trace context, carried on as the distributed-tracing extension."""
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "type": reply_type(action, outcome.succeeded),
        "source": REPLY_SOURCE.format(action=action),
        "id": reply_id(run_id, outcome.succeeded),
        "datacontenttype": "application/json",
        "requestid": request_id,
    }
    if subject:
        attributes["subject"] = subject
    attributes.update(trace_attributes(trace))
    return CloudEvent(attributes=attributes, data=reply_data(outcome))


def reply_id(run_id: str, succeeded: bool) -> str:
    """A reply's event id: derived from its run, so a replayed reply is the same event."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{succeeded}"))


def reply_data(outcome: Outcome) -> dict[str, Any]:
    if outcome.failure is not None:
        return {"error": outcome.failure.as_dict()}
    return dict(outcome.data or {})


def discovered_events(
    *,
    outcome: Outcome,
    request_id: str,
    subject: str | None,
    run_id: str,
    history: HistoryPlan | None,
    trace: TraceContext | None = None,
) -> list[CloudEvent]:
    """One ``version.discovered`` event per version in a check's ``new`` (none without a
    history). Ids derive from the run and the version, so a redelivered run's events are the
    same events. Data: the version and the resource's key (an HMAC: no source in it).
    ``trace``: the request's trace context, carried on as on the reply."""
    if history is None or outcome.data is None:
        return []
    return [
        CloudEvent(
            attributes={
                "specversion": "1.0",
                "type": DISCOVERED_TYPE,
                "source": REPLY_SOURCE.format(action="check"),
                "id": str(
                    uuid.uuid5(
                        uuid.NAMESPACE_URL,
                        f"{run_id}/discovered/{canonical_json(version).decode()}",
                    )
                ),
                "datacontenttype": "application/json",
                "requestid": request_id,
                **({"subject": subject} if subject else {}),
                **trace_attributes(trace),
            },
            data={"version": version, "resource": history.resource_key},
        )
        for version in outcome.data.get("new") or []
    ]


def reply_events(
    *,
    action: Action,
    outcome: Outcome,
    request_id: str,
    subject: str | None,
    run_id: str,
    history: HistoryPlan | None,
    trace: TraceContext | None = None,
) -> list[CloudEvent]:
    """Everything an asynchronous run posts to the sink: the discovered versions, then the
    reply (so a consumer of the reply finds the discoveries already sent)."""
    found = discovered_events(
        outcome=outcome,
        request_id=request_id,
        subject=subject,
        run_id=run_id,
        history=history,
        trace=trace,
    )
    reply = reply_event(
        action=action,
        outcome=outcome,
        request_id=request_id,
        subject=subject,
        run_id=run_id,
        trace=trace,
    )
    return [*found, reply]
