"""``send ACTION DATA``: post one request event to the Broker (``$K_SINK``), as a scheduled
check does (a CronJob whose SinkBinding injects ``K_SINK``; knative/tekton/examples/).

The event carries ``build.team`` as its ``team`` attribute, and, with Knative's
``authentication-oidc`` on, the SinkBinding's token (``functions.sink``). The event id is the
caller's (``--id``): a retried pod of the same Job posts the same
``(source, id)``, which the functions attach to the run already under way. The data is
checked to be a JSON object here; the functions judge the rest (a refusal ends up at the
dead-letter sink, or, posted straight to a service, as its 400).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, TextIO

from cloudevents.core.v1.event import CloudEvent

from functions.errors import ConfigError, InvalidRequest
from functions.events import request_type
from functions.replies import team_attributes
from functions.sink import post_reply

DEFAULT_SOURCE = "/resource-functions/cli"


def request_event(
    action: str,
    data: Any,
    *,
    event_id: str = "",
    source: str = "",
    subject: str = "",
    extensions: Mapping[str, str] | None = None,
) -> CloudEvent:
    """The request event ``send`` posts (pure: the tests build theirs with it too)."""
    attributes = {
        "specversion": "1.0",
        "type": request_type(action),
        "source": source or DEFAULT_SOURCE,
        "id": event_id or str(uuid.uuid4()),
        "datacontenttype": "application/json",
        **(extensions or {}),
    }
    if subject:
        attributes["subject"] = subject
    return CloudEvent(attributes=attributes, data=data)


def send(
    action: str,
    data: Any,
    *,
    sink: str,
    out: TextIO,
    attempts: int = 5,
    event_id: str = "",
    source: str = "",
    subject: str = "",
) -> int:
    if not sink:
        raise ConfigError("no sink: pass --sink or set K_SINK (a SinkBinding injects it)")
    if not isinstance(data, dict):
        raise InvalidRequest("DATA must be a JSON object (the request's data)")
    build = data.get("build")
    team = build.get("team") if isinstance(build, dict) else None
    event = request_event(
        action,
        data,
        event_id=event_id,
        source=source,
        subject=subject,
        # build.team travels as the event's team attribute too: with sender authentication
        # the Broker's EventPolicies decide by it who may name which team (docs/sender-auth.md)
        extensions=team_attributes(team) if isinstance(team, str) else None,
    )
    post_reply(sink, event, attempts=attempts, timeout=30)
    print(f"posted {event.get_type()} {event.get_id()} to {sink}", file=out)
    return 0
