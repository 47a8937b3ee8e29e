"""What to do next with a CustomRun (pure): derived from the object and the time alone, so a
restarted controller takes up every run where the cluster says it is.

An attempt's request id is made new and random when the attempt starts (``Context.new_id``)
and written into the status before the request is posted: re-posted after a restart it is the
same request, which the functions attach to the run already under way. It is not derived
from anything a tenant reads elsewhere (the uid is in BUILD_ID, in logs), so a request of
another team cannot carry it; a reply counts only if it answers that id, for the run's team,
from the function of the run's kind (``on_reply``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.events import STOP_ATTRIBUTE, request_type
from functions.model import ResourceType
from functions.replies import REPLY_SOURCE, TEAM_ATTRIBUTE
from functions.tekton import status as st
from functions.tekton.params import BadParams, RunRequest, action_of, is_ours, run_request

SUBJECT_PREFIX = "tekton.dev/customruns/"  # + <namespace>/<name>: the replies carry it back
CANCELLED_SPEC = "RunCancelled"
DEFAULT_TIMEOUT = timedelta(minutes=60)  # Tekton's default, per attempt
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Context:
    """What decisions need of the controller's configuration."""

    event_source: str
    team_of: Callable[[str], str | None]  # namespace -> team, None: not served
    resource_types: Mapping[str, ResourceType] = field(default_factory=dict)
    artifact_url_prefix: str = ""
    # why a namespace serves no team (``namespace_teams.NamespaceTeams.refusal``)
    refusal: Callable[[str], str] = lambda namespace: f"namespace {namespace!r} is not served"
    allowed_images: tuple[str, ...] = ("*",)  # the functions' ALLOWED_IMAGES
    new_id: Callable[[], str] = lambda: secrets.token_hex(16)  # a new attempt's request id


@dataclass(frozen=True)
class Posting:
    """A request event to post to the Broker: its attributes and data."""

    request_id: str
    attributes: dict[str, Any]
    data: dict[str, Any] = field(repr=False)  # source and params: secret


@dataclass(frozen=True)
class Step:
    """Effects, in order: post ``stop`` (the stop of the attempt that ended), write
    ``status``, post ``post`` (unless this process posted it already), look again at
    ``wake_at``."""

    status: dict[str, Any] | None = None
    post: Posting | None = None
    stop: Posting | None = None
    wake_at: datetime | None = None
    dropped: str = ""  # why a reply changed nothing, when it was not merely stale


@dataclass(frozen=True)
class Reply:
    """The part of a reply event that decides: whose request it answers, and how it ended;
    and what binds it to the request: the action of its type, its source and its team."""

    request_id: str
    succeeded: bool
    data: dict[str, Any]
    action: str = ""
    source: str = ""
    team: str = ""


def subject(namespace: str, name: str) -> str:
    return f"{SUBJECT_PREFIX}{namespace}/{name}"


def parse_subject(value: str, prefix: str = SUBJECT_PREFIX) -> tuple[str, str] | None:
    """``(namespace, name)`` of a reply's subject, or None if it is not an object's of
    ``prefix`` (a CustomRun's unless told)."""
    if not value.startswith(prefix):
        return None
    namespace, _, name = value[len(prefix) :].partition("/")
    return (namespace, name) if namespace and name and "/" not in name else None


def parse_duration(value: str) -> timedelta:
    """A Go duration as Kubernetes writes ``metav1.Duration`` (``1h0m0s``, ``90s``,
    ``0s``); ``ValueError`` for anything else."""
    text = value.strip()
    if text in ("0", ""):
        return timedelta(0)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {value!r}")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def timeout_of(run: Mapping[str, Any]) -> timedelta | None:
    """The per-attempt timeout: ``spec.timeout``, 60 minutes when absent, None for 0."""
    given = (run.get("spec") or {}).get("timeout")
    try:
        timeout = DEFAULT_TIMEOUT if given is None else parse_duration(str(given))
    except ValueError as err:
        raise ValueError(f"spec.timeout: {err}") from None
    return timeout or None


def retries_wanted(run: Mapping[str, Any]) -> int:
    """``spec.retries`` (Tekton's CRD says integer; the object may have come another way)."""
    wanted = (run.get("spec") or {}).get("retries") or 0
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
        raise ValueError(f"spec.retries must be a whole number, not {wanted!r}")
    return wanted


def retries_left(run: Mapping[str, Any]) -> bool:
    return st.attempt_of(run.get("status") or {}) < retries_wanted(run)


def deadline_of(run: Mapping[str, Any], started: datetime) -> datetime | None:
    timeout = timeout_of(run)
    return None if timeout is None else started + timeout


def decide(run: Mapping[str, Any], now: datetime, ctx: Context) -> Step:
    """The next step for ``run`` at ``now`` (watch event, deadline, restart)."""
    if not is_ours(run):
        return Step()
    status = dict(run.get("status") or {})
    if st.is_done(status):
        return Step()  # Tekton patches cancellation into finished runs too: nothing to do
    spec = run.get("spec") or {}
    current = (status.get("extraFields") or {}).get("requestId")
    if spec.get("status") == CANCELLED_SPEC:
        message = spec.get("statusMessage") or "the CustomRun was cancelled"
        return Step(
            status=st.finished(status, False, st.CANCELLED, message, now),
            stop=stop_posting(run, current, ctx),
        )
    try:
        timeout_of(run)
        retries_wanted(run)
        request = build_request(run, ctx)
    except (BadParams, ValueError) as err:
        why = f"bad params: {err}" if isinstance(err, BadParams) else f"bad spec: {err}"
        return Step(
            status=st.finished(status, False, st.BAD_PARAMS, why, now),
            stop=stop_posting(run, current, ctx),
        )
    team = request.data["build"]["team"]
    if not current or not status.get("startTime"):
        first = ctx.new_id()
        return Step(
            status=st.started(status, first, team, now),
            post=posting(run, request, first, ctx),
            wake_at=deadline_of(run, now),
        )
    changed = team_changed(run, status, team, now)
    if changed is not None:
        return Step(status=changed, stop=stop_posting(run, current, ctx))
    deadline = deadline_of(run, st.parse_time(status["startTime"]))
    if deadline is not None and now >= deadline:
        message = f"attempt {st.attempt_of(status) + 1} timed out after {timeout_of(run)}"
        if retries_left(run):
            following = ctx.new_id()
            return Step(
                status=st.retried(status, st.TIMED_OUT, message, following, team, now),
                stop=stop_posting(run, current, ctx),
                post=posting(run, request, following, ctx),
                wake_at=deadline_of(run, now),
            )
        return Step(
            status=st.finished(status, False, st.TIMED_OUT, message, now),
            stop=stop_posting(run, current, ctx),
        )
    return Step(post=posting(run, request, current, ctx), wake_at=deadline)


def on_reply(run: Mapping[str, Any], reply: Reply, now: datetime, ctx: Context) -> Step:
    """The step a reply event leads to: none for a run that is done, or for a request that
    is not the attempt under way (a stale attempt's late reply)."""
    status = dict(run.get("status") or {})
    if not is_ours(run) or st.is_done(status):
        return Step()
    if (status.get("extraFields") or {}).get("requestId") != reply.request_id:
        return Step()
    action = action_of(run)
    unbound = not_bound(run, reply, action, ctx)
    if unbound:
        return Step(dropped=unbound)
    if reply.succeeded:
        return Step(
            status=st.finished(
                status,
                True,
                st.SUCCEEDED,
                success_message(action, reply.data),
                now,
                st.results_of(action, reply.data),
            )
        )
    found = reply.data.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    reason = st.failure_reason(str(error.get("kind") or ""))
    message = st.failure_message(action, error)
    if retries_left(run):
        following = ctx.new_id()
        request = build_request(run, ctx)
        team = request.data["build"]["team"]
        changed = team_changed(run, status, team, now)
        if changed is not None:  # no next attempt for another team
            return Step(status=changed)
        return Step(
            status=st.retried(status, reason, message, following, team, now),
            post=posting(run, request, following, ctx),
            wake_at=deadline_of(run, now),
        )
    return Step(status=st.finished(status, False, reason, message, now))


def team_changed(
    run: Mapping[str, Any], status: dict[str, Any], team: str, now: datetime
) -> dict[str, Any] | None:
    """The run's status ended ``TeamChanged`` if its namespace now serves ``team`` and not
    the team its attempt was posted for; None if it serves the same."""
    posted_for = st.team_of_attempt(status)
    if posted_for is None or posted_for == team:
        return None
    message = (
        f"namespace {run['metadata']['namespace']!r} now serves team {team!r}, not "
        f"{posted_for!r}, for which this run's request was posted: the run is stopped"
    )
    return st.finished(status, False, st.TEAM_CHANGED, message, now)


def refused(run: Mapping[str, Any], request_id: str, why: str, now: datetime) -> Step:
    """The step for an attempt whose request the Broker refused for good (401, 403: no
    policy lets the controller post for this team): the run ends, saying so."""
    status = dict(run.get("status") or {})
    if st.is_done(status) or (status.get("extraFields") or {}).get("requestId") != request_id:
        return Step()
    return Step(status=st.finished(status, False, st.REFUSED, why, now))


def not_bound(run: Mapping[str, Any], reply: Reply, action: str, ctx: Context) -> str:
    """Why ``reply`` (which names the attempt's request id) is not this run's answer: its
    type's action is not the run's kind, its source is not that function's, or its team is
    not the run's namespace's. "" when it is."""
    if reply.action != action:
        return f"a reply of type action {reply.action!r} does not answer a {action}"
    if reply.source != REPLY_SOURCE.format(action=action):
        return f"source {reply.source!r} is not the {action} function's"
    team = team_of_run(run, ctx)
    if team is None or reply.team != team:
        return f"team {reply.team!r} is not the run's team {team!r}"
    return ""


def success_message(action: str, data: dict[str, Any]) -> str:
    if action == "check":
        return f"check found {len(data.get('versions') or [])} version(s)"
    cached = " (from the cache)" if data.get("cached") else ""
    return f"{action} of version {st.results_of('put', data)['version']}{cached}"


def build_request(run: Mapping[str, Any], ctx: Context) -> RunRequest:
    """The run's request with its ``build`` block (team from the namespace, never a param)."""
    meta = run["metadata"]
    team = ctx.team_of(meta["namespace"])
    if team is None:
        raise BadParams(ctx.refusal(meta["namespace"]))
    request = run_request(
        run,
        resource_types=ctx.resource_types,
        artifact_url_prefix=ctx.artifact_url_prefix,
        allowed_images=ctx.allowed_images,
    )
    # Tekton's labels name the pipeline (whose pipeline-scoped Secrets ((var)) may read) only
    # on a CustomRun its PipelineRun made; a bare CustomRun's labels are its author's word.
    labels = (meta.get("labels") or {}) if owned_by_pipeline_run(run) else {}
    build = {
        "id": meta["uid"],
        "name": labels.get("tekton.dev/pipelineRun") or meta["name"],
        "job": labels.get("tekton.dev/pipelineTask") or meta["name"],
        "pipeline": labels.get("tekton.dev/pipeline") or "",
        "team": team,
    }
    return RunRequest(request.action, {**request.data, "build": build})


def owned_by_pipeline_run(run: Mapping[str, Any]) -> bool:
    """Whether a PipelineRun made ``run`` (its controlling owner)."""
    owners = (run.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(o, dict)
        and o.get("kind") == "PipelineRun"
        and str(o.get("apiVersion", "")).startswith("tekton.dev/")
        and o.get("controller") is True
        for o in owners
    )


def stop_posting(run: Mapping[str, Any], request_id: str | None, ctx: Context) -> Posting | None:
    """The stop of attempt ``request_id``'s request (``functions.service.stop_requests``): its type,
    source and team, the extension ``stops`` naming it, its own id derived from it (a repost
    is the same stop). The functions stop whatever runs for it, and a request still in the
    Broker's retries never starts. None when there is nothing to name."""
    if not request_id:
        return None
    try:
        action = action_of(run)
    except BadParams:
        return None
    team = team_of_run(run, ctx)
    if team is None:
        return None
    stop_id = f"stop-{request_id}"
    attributes = {**request_attributes(run, action, stop_id, team, ctx), STOP_ATTRIBUTE: request_id}
    return Posting(stop_id, attributes, {})


def team_of_run(run: Mapping[str, Any], ctx: Context) -> str | None:
    """The team of the attempt under way: the one its request was posted for, or (for one
    started before that was recorded) its namespace's now."""
    return st.team_of_attempt(dict(run.get("status") or {})) or ctx.team_of(
        run["metadata"]["namespace"]
    )


def posting(run: Mapping[str, Any], request: RunRequest, rid: str, ctx: Context) -> Posting:
    team = request.data["build"]["team"]
    attributes = {
        **request_attributes(run, request.action, rid, team, ctx),
        "datacontenttype": "application/json",
    }
    return Posting(rid, attributes, request.data)


def request_attributes(
    run: Mapping[str, Any], action: str, rid: str, team: str, ctx: Context
) -> dict[str, Any]:
    """What a request and a stop of it both carry: the action's request type, the controller
    as source, the event's id, the run as subject, the team."""
    meta = run["metadata"]
    return {
        "specversion": "1.0",
        "type": request_type(action),
        "source": ctx.event_source,
        "id": rid,
        "subject": subject(meta["namespace"], meta["name"]),
        TEAM_ATTRIBUTE: team,
    }
