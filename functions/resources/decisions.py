"""What one look at a Resource, or one reply to its check, leads to (pure functions of the
object, the time and the configuration); the scheduler's shell carries it out.

A look: a spec the functions would refuse, or a namespace that serves no team, is said in
the ``Checked`` condition and nothing is posted; a paused resource is left as it is; a check
still out (claimed, not answered) is posted again on a growing schedule, under the same
request id, and given up after ``ABANDON_INTERVALS`` intervals (at least ``ABANDON_SECONDS``);
otherwise, once its slot has begun (``schedule``), the slot is claimed in the status (its
start, request id, the version it is checked from, the team) and the check request posted.

A reply: only the answer to the claimed request, from the check function, for the claimed
team, is taken; it sets the latest version, the count of versions seen, the time and the
condition (a failure's kind, message and the functions' redacted log tail). Nothing of the
spec's ``source`` is ever written to the status.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.errors import InvalidRequest
from functions.events import request_type
from functions.kube.custom_objects import Kind
from functions.model import ResourceType
from functions.replies import REPLY_SOURCE, TEAM_ATTRIBUTE
from functions.request_data import image_allowed, image_refusal, parse_request_data
from functions.resources import schedule
from functions.tekton import status as st
from functions.tekton.decide import Posting, Reply, parse_duration
from functions.tekton.decide import parse_subject as parse_object_subject

API_VERSION = "resource-functions.dev/v1alpha1"
KIND = "Resource"
# The kind as the API serves it (knative/tekton/resource-crd.yaml), decoded within the bounds a
# CustomRun is: a Resource of the schema's sizes is far inside them.
RESOURCES = Kind(
    "resource-functions.dev",
    "v1alpha1",
    "resources",
    KIND,
    component="resource-functions-scheduler",
)
SUBJECT_PREFIX = "resource-functions.dev/resources/"  # + <namespace>/<name>: replies carry it
CHECKED = "Checked"  # the condition's type
DEFAULT_INTERVAL = 60  # seconds: Concourse's default check_every
MIN_INTERVAL = 10
MAX_INTERVAL = 7 * 24 * 3600
REPOST_FIRST = 60  # a check still out is posted again after this, doubling ...
REPOST_MAX = 600  # ... up to this
ABANDON_INTERVALS = 3  # a check still out after this many intervals ...
ABANDON_SECONDS = 900  # ... and at least this long is given up: the next slot is claimed
TEAM_AGAIN = 60  # a namespace that serves no team is looked at again after this
MAX_SOURCE_BYTES = 64 * 1024  # a source's JSON; the CRD's schema bounds the object too
LATEST_TEXT = 63  # the printer column's rendering of the latest version


@dataclass(frozen=True)
class Context:
    """What decisions need of the controller's configuration."""

    event_source: str
    team_of: Callable[[str], str | None]  # namespace -> team, None: not served
    resource_types: Mapping[str, ResourceType] = field(default_factory=dict)
    refusal: Callable[[str], str] = lambda namespace: f"namespace {namespace!r} is not served"
    allowed_images: tuple[str, ...] = ("*",)
    min_interval: int = MIN_INTERVAL  # the shortest checkEvery taken (tests: shorter)


@dataclass(frozen=True)
class Step:
    """Effects, in order: write ``status`` (when not None), post ``post``, look again at
    ``wake_at``; ``dropped``: why a reply was not taken (when not merely stale)."""

    status: dict[str, Any] | None = None
    post: Posting | None = None
    wake_at: datetime | None = None
    dropped: str = ""


class BadSpec(ValueError):
    """The Resource's spec cannot become a check request; the message says what is wrong."""


def subject(namespace: str, name: str) -> str:
    return f"{SUBJECT_PREFIX}{namespace}/{name}"


def parse_subject(value: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a reply's subject, or None if it is not a Resource's."""
    return parse_object_subject(value, SUBJECT_PREFIX)


def interval_of(spec: Mapping[str, Any], minimum: int = MIN_INTERVAL) -> int:
    """``spec.checkEvery`` in whole seconds (a Go duration: ``30s``, ``1m``, ``1h30m``)."""
    given = spec.get("checkEvery")
    if given is None:
        return DEFAULT_INTERVAL
    try:
        seconds = int(parse_duration(str(given)).total_seconds())
    except ValueError:
        raise BadSpec(f"checkEvery {str(given)[:40]!r} is not a duration (30s, 1m, 1h)") from None
    if not minimum <= seconds <= MAX_INTERVAL:
        raise BadSpec(f"checkEvery must be between {minimum}s and 168h, not {given}")
    return seconds


def check_data(resource: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    """The check request's data of ``resource`` without version and build (``BadSpec`` for
    what the functions would refuse: judged by their own ``parse_request_data``)."""
    spec = resource.get("spec") or {}
    data: dict[str, Any] = {}
    for name in ("type", "image"):
        if spec.get(name) is not None:
            data[name] = spec[name]
    data["source"] = spec.get("source") if spec.get("source") is not None else {}
    size = len(json.dumps(data["source"], separators=(",", ":")))
    if size > MAX_SOURCE_BYTES:
        raise BadSpec(f"the source is {size} bytes of JSON, more than {MAX_SOURCE_BYTES}")
    try:
        parse_request_data(
            data,
            action="check",
            event={"id": "-", "source": "-"},
            resource_types=ctx.resource_types,
            artifact_url_prefix="",
            reply_async=True,
        )
    except InvalidRequest as err:
        raise BadSpec("; ".join(err.problems)) from None
    image = data.get("image")
    if isinstance(image, str) and not image_allowed(image, ctx.allowed_images):
        raise BadSpec(image_refusal(image))
    return data


def decide(
    resource: Mapping[str, Any], now: datetime, ctx: Context, posted_here: Callable[[str], bool]
) -> Step:
    """One look at ``resource``. ``posted_here(request_id)``: whether this process has posted
    that request (a claim it did not post, a previous leader's, is posted again at once)."""
    meta = resource["metadata"]
    spec = resource.get("spec") or {}
    status = copy.deepcopy(dict(resource.get("status") or {}))
    if spec.get("paused") is True:
        return Step()  # keeps its status; a change of spec is a watch event
    try:
        interval = interval_of(spec, ctx.min_interval)
        data = check_data(resource, ctx)
    except BadSpec as err:
        return Step(status=_settled(status, "False", "InvalidSpec", str(err), now, meta))
    team = ctx.team_of(meta["namespace"])
    if team is None:
        refusal = ctx.refusal(meta["namespace"])
        return Step(
            status=_settled(status, "False", "NoTeam", refusal, now, meta),
            wake_at=now + timedelta(seconds=TEAM_AGAIN),
        )
    slot = schedule.slot_start(now.timestamp(), interval, schedule.offset_of(meta["uid"], interval))
    next_slot = _at(slot + interval)
    check = dict(status.get("check") or {})
    rid = check.get("requestId")
    if rid and rid != status.get("answered"):  # still out
        claimed = st.parse_time(check["slot"])
        give_up = claimed + timedelta(seconds=max(ABANDON_INTERVALS * interval, ABANDON_SECONDS))
        if now < give_up:
            posts = int(check.get("posts") or 1)
            due = st.parse_time(check["postedAt"]) + timedelta(seconds=_repost_delay(posts))
            if posted_here(rid) and now < due:
                return Step(wake_at=min(due, give_up))
            check.update(posts=posts + 1, postedAt=st.timestamp(now))
            status["check"] = check
            post = _posting(meta, rid, check, data, ctx)
            return Step(status=status, post=post, wake_at=min(now + _delay(posts + 1), give_up))
        message = (
            f"no reply to check request {rid} within {int((now - claimed).total_seconds())} s"
            " (the check functions down, or its reply lost): the next check is posted"
        )
        status = _settled(status, "Unknown", "NoReply", message, now, meta)
        status["answered"] = rid
    last = check.get("slot")
    if last is not None and st.parse_time(last).timestamp() >= slot:
        return Step(status=_observed(status, meta), wake_at=next_slot)
    rid = schedule.request_id(meta["uid"], slot)
    version = status.get("latestVersion")
    check = {
        "slot": st.timestamp(_at(slot)),
        "requestId": rid,
        "postedAt": st.timestamp(now),
        "posts": 1,
        "team": team,
        **({"version": version} if isinstance(version, dict) else {}),
    }
    status["check"] = check
    return Step(
        status=_observed(status, meta),
        post=_posting(meta, rid, check, data, ctx),
        wake_at=min(next_slot, now + _delay(1)),
    )


def on_reply(resource: Mapping[str, Any], reply: Reply, now: datetime) -> Step:
    """The step a reply leads to: none for a request that is not the claimed one, or that is
    answered already; ``dropped`` for one not from the check function or not for the claimed
    team."""
    status = copy.deepcopy(dict(resource.get("status") or {}))
    check = dict(status.get("check") or {})
    if reply.request_id != check.get("requestId") or reply.request_id == status.get("answered"):
        return Step()
    if reply.action != "check" or reply.source != REPLY_SOURCE.format(action="check"):
        return Step(dropped=f"a reply of {reply.action!r} from {reply.source!r} is no check's")
    if reply.team != check.get("team"):
        return Step(dropped=f"team {reply.team!r} is not the check's team {check.get('team')!r}")
    meta = resource["metadata"]
    status["answered"] = reply.request_id
    status["lastChecked"] = st.timestamp(now)
    if not reply.succeeded:
        found = reply.data.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        reason = st.failure_reason(str(error.get("kind") or ""))
        return Step(
            status=_settled(status, "False", reason, st.failure_message("check", error), now, meta)
        )
    versions = [v for v in reply.data.get("versions") or [] if isinstance(v, dict)]
    new = [v for v in versions if v != check.get("version")]
    if versions:
        status["latestVersion"] = versions[-1]
        status["latest"] = latest_text(versions[-1])
    status["versionsSeen"] = int(status.get("versionsSeen") or 0) + len(new)
    message = f"{len(new)} new version(s)" if new else "no new version"
    return Step(status=_settled(status, "True", "Succeeded", message, now, meta))


def latest_text(version: Mapping[str, Any]) -> str:
    """A version as the printer column shows it: ``ref=1f2e…``, cut to fit."""
    text = ",".join(f"{k}={v}" for k, v in version.items())
    return text if len(text) <= LATEST_TEXT else text[: LATEST_TEXT - 1] + "…"


def condition_of(status: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == CHECKED), None)


def _posting(
    meta: Mapping[str, Any],
    rid: str,
    check: Mapping[str, Any],
    data: dict[str, Any],
    ctx: Context,
) -> Posting:
    build = {"team": check["team"], "pipeline": "", "job": meta["name"], "id": rid}
    version = check.get("version")
    body = {**data, **({"version": version} if version is not None else {}), "build": build}
    attributes = {
        "specversion": "1.0",
        "type": request_type("check"),
        "source": ctx.event_source,
        "id": rid,
        "subject": subject(meta["namespace"], meta["name"]),
        TEAM_ATTRIBUTE: check["team"],
        "datacontenttype": "application/json",
    }
    return Posting(rid, attributes, body)


def _settled(
    status: dict[str, Any],
    state: str,
    reason: str,
    message: str,
    now: datetime,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """``status`` with its Checked condition set (the transition time kept when the state
    does not change)."""
    old = condition_of(status) or {}
    moved = old.get("status") != state
    condition = {
        "type": CHECKED,
        "status": state,
        "reason": reason,
        "message": st.clip(message),
        "lastTransitionTime": st.timestamp(now) if moved else old.get("lastTransitionTime"),
    }
    others = [c for c in status.get("conditions") or [] if c.get("type") != CHECKED]
    return _observed({**status, "conditions": [*others, condition]}, meta)


def _observed(status: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    if meta.get("generation") is not None:
        status["observedGeneration"] = meta["generation"]
    return status


def _repost_delay(posts: int) -> int:
    return int(min(REPOST_FIRST * 2 ** max(0, posts - 1), REPOST_MAX))


def _delay(posts: int) -> timedelta:
    return timedelta(seconds=_repost_delay(posts))


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
