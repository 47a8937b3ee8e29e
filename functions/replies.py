"""The events a run answers with (pure): its reply, and a check's ``version.discovered``
events. The function and ``collect`` (asynchronous completion) both send them, so they are
built here and nowhere else; the same run gives the same event ids, so a consumer can drop
the double. Each carries the ``team`` extension attribute of its request (``build.team``; none
for a request naming no team), so a Trigger routes a team's replies to that team alone.
"""

from __future__ import annotations

import uuid
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from functions.events import TYPE_PREFIX
from functions.keys import canonical_json
from functions.model import Action, HistoryPlan, Outcome, ReplyAddress
from functions.tracing import trace_attributes

REPLY_SOURCE = "/resource-functions/{action}"
DISCOVERED_TYPE = f"{TYPE_PREFIX}version.discovered"
TEAM_ATTRIBUTE = "team"  # the request's build.team, on the request and on its events


def team_attributes(team: str) -> dict[str, str]:
    """The ``team`` attribute of an event answering a request of ``team`` (none for "")."""
    return {TEAM_ATTRIBUTE: team} if team else {}


def reply_type(action: str, succeeded: bool) -> str:
    return f"{TYPE_PREFIX}{action}.{'succeeded' if succeeded else 'failed'}"


def reply_event(action: Action, outcome: Outcome, address: ReplyAddress) -> CloudEvent:
    """The reply CloudEvent for an outcome (pure: same inputs, same event but for ``time``),
    to the request ``address`` names: its id, subject, team and trace context carried on."""
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "type": reply_type(action, outcome.succeeded),
        "source": REPLY_SOURCE.format(action=action),
        "id": reply_id(address.run_id, outcome.succeeded),
        "datacontenttype": "application/json",
        "requestid": address.request_id,
    }
    if address.subject:
        attributes["subject"] = address.subject
    attributes.update(team_attributes(address.team))
    attributes.update(trace_attributes(address.trace))
    return CloudEvent(attributes=attributes, data=reply_data(outcome))


def reply_id(run_id: str, succeeded: bool) -> str:
    """A reply's event id: derived from its run, so a replayed reply is the same event."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{succeeded}"))


def reply_data(outcome: Outcome) -> dict[str, Any]:
    if outcome.failure is not None:
        return {"error": outcome.failure.as_dict()}
    return dict(outcome.data or {})


def discovered_events(
    outcome: Outcome, address: ReplyAddress, history: HistoryPlan | None
) -> list[CloudEvent]:
    """One ``version.discovered`` event per version in a check's ``new`` (none without a
    history). Ids derive from the resource and the version (``discovered_id``): a version is
    one event however many checks found it, and a redelivered run's events are the same
    events. Data: the version and the resource's key (an HMAC: no source in it). The
    request's id, subject, team and trace context are carried on as on the reply."""
    if history is None or outcome.data is None:
        return []
    return [
        CloudEvent(
            attributes={
                "specversion": "1.0",
                "type": DISCOVERED_TYPE,
                "source": REPLY_SOURCE.format(action="check"),
                "id": discovered_id(history.resource_key, version),
                "datacontenttype": "application/json",
                "requestid": address.request_id,
                **({"subject": address.subject} if address.subject else {}),
                **team_attributes(address.team),
                **trace_attributes(address.trace),
            },
            data={"version": version, "resource": history.resource_key},
        )
        for version in outcome.data.get("new") or []
    ]


def discovered_id(resource_key: str, version: dict[str, str]) -> str:
    """A discovered version's event id: one per (resource, version)."""
    key = f"{resource_key}/discovered/{canonical_json(version).decode()}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))


def reply_events(
    action: Action, outcome: Outcome, address: ReplyAddress, history: HistoryPlan | None
) -> list[CloudEvent]:
    """Everything an asynchronous run posts to the sink: the discovered versions, then the
    reply (so a consumer of the reply finds the discoveries already sent)."""
    return [*discovered_events(outcome, address, history), reply_event(action, outcome, address)]
