"""Building and sending request events with the cloudevents SDK, as a pipeline engine would."""

from __future__ import annotations

import requests
from cloudevents.core.bindings.http import (
    HTTPMessage,
    from_http_event,
    to_binary_event,
    to_structured_event,
)
from cloudevents.core.v1.event import CloudEvent

from functions.cli.send import request_event as shipped_request_event

ENCODERS = {"binary": to_binary_event, "structured": to_structured_event}


def request_event(
    action: str,
    data: dict,
    *,
    event_id: str | None = None,
    source: str = "/tests/pipeline",
    subject: str | None = None,
    **extensions: str,
) -> CloudEvent:
    return shipped_request_event(
        action,
        data,
        event_id=event_id or "",
        source=source,
        subject=subject or "",
        extensions=extensions,
    )


def send(
    url: str,
    event: CloudEvent,
    mode: str = "binary",
    timeout: float = 120,
    headers: dict[str, str] | None = None,
):
    """POST the event; returns (status, reply CloudEvent or None, raw response)."""
    message = ENCODERS[mode](event)
    response = requests.post(
        url, headers={**message.headers, **(headers or {})}, data=message.body, timeout=timeout
    )
    reply = None
    if response.status_code == 200:
        reply = from_http_event(HTTPMessage(headers=dict(response.headers), body=response.content))
    return response.status_code, reply, response
