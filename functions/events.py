"""CloudEvents in and out over HTTP, through the cloudevents SDK (2.x API).

Requests are accepted in binary and structured content mode; replies are sent in binary
mode. The reply event itself is built by ``functions.replies.reply_event``: the
function and the task's ``collect`` step both send it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event, to_binary_event
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent

from functions.errors import InvalidRequest
from functions.model import Action

TYPE_PREFIX = "dev.resourcefunctions."
MAX_BODY_BYTES = 4 * 1024 * 1024
PING_TYPE = "dev.knative.sources.ping"
# A request event with this extension is a stop of the request whose id it holds
# (``functions.service.stop_requests``).
STOP_ATTRIBUTE = "stops"
_SURROGATE = re.compile("[\ud800-\udfff]")


def request_type(action: str) -> str:
    return f"{TYPE_PREFIX}{action}.requested"


def read_event(headers: Mapping[str, str], body: bytes) -> CloudEvent:
    """Parse an HTTP request into a CloudEvent; ``InvalidRequest`` says what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise InvalidRequest(f"request body is larger than {MAX_BODY_BYTES} bytes")
    lowered = {k.lower(): v for k, v in headers.items()}
    binary = "ce-specversion" in lowered
    if not binary and "cloudevents" not in lowered.get("content-type", ""):
        raise InvalidRequest(
            "not a CloudEvent: send ce-specversion/ce-type/ce-source/ce-id headers (binary "
            "mode) or Content-Type: application/cloudevents+json (structured mode)"
        )
    if not binary:
        _structured_object(body)
    try:
        event = from_http_event(HTTPMessage(headers=lowered, body=body))
    except (BaseCloudEventException, ValueError, TypeError, KeyError) as err:
        raise InvalidRequest(f"invalid CloudEvent: {_short(str(err))}") from None
    except RecursionError:
        raise InvalidRequest("invalid CloudEvent: JSON nested too deeply") from None
    if not isinstance(event, CloudEvent):
        raise InvalidRequest("only CloudEvents specversion 1.0 is supported")
    if not _sent_id(lowered, body):  # the SDK invents one, which would defeat redelivery
        raise InvalidRequest("the event has no id: redelivery is recognised by (source, id)")
    _check_encodable(event)
    return event


def _structured_object(body: bytes) -> None:
    """A structured-mode body is one JSON object (anything else would be a permanent error
    deep inside the SDK)."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise InvalidRequest("invalid CloudEvent: JSON nested too deeply") from None
    except ValueError as err:
        raise InvalidRequest(f"invalid CloudEvent: body is not JSON: {_short(str(err))}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("invalid CloudEvent: a structured-mode event must be a JSON object")


def _check_encodable(event: CloudEvent) -> None:
    """Attributes reach reply headers, logs and keys: each must be valid Unicode (JSON can
    carry a lone surrogate, ``"\\ud800"``, which no header or UTF-8 text can)."""
    problems = []
    for name, value in sorted(event.get_attributes().items()):
        if isinstance(value, str) and _SURROGATE.search(value):
            problems.append(f"event attribute {name!r} is not valid Unicode (a lone surrogate)")
    if problems:
        raise InvalidRequest(*problems)


def _sent_id(headers: Mapping[str, str], body: bytes) -> bool:
    """Whether the sender set the event's id (binary: ce-id; structured: the "id" member)."""
    if "ce-specversion" in headers:
        return bool(headers.get("ce-id"))
    try:
        return bool(json.loads(body).get("id"))
    except (ValueError, AttributeError):
        return False


def event_data(event: CloudEvent) -> Any:
    """The event's data as JSON; text or bytes are decoded, and must be JSON."""
    data = event.get_data()
    if isinstance(data, (bytes, str)):
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as err:
            raise InvalidRequest(f"data is not valid JSON: {_short(str(err))}") from None
        except RecursionError:
            raise InvalidRequest("data is JSON nested too deeply") from None
    return data


def _short(text: str, limit: int = 300) -> str:
    """Error texts may quote request bytes: keep them short."""
    return text if len(text) <= limit else text[:limit] + "…"


def check_type(event: CloudEvent, action: Action) -> None:
    """Each service takes its own request type; check also takes PingSource ticks, whose
    type cannot be set (their data is a check request)."""
    if action == "check" and event.get_type() == PING_TYPE:
        return
    if event.get_type() != request_type(action):
        raise InvalidRequest(
            f"this is the {action} service: event type must be {request_type(action)!r}, "
            f"got {event.get_type()!r}"
        )


def reply_async(event: CloudEvent, *, default: str, sink: str) -> bool:
    """Whether the request asks for its reply at K_SINK (``sink``) rather than in the HTTP
    response: its ``replymode`` extension, else the service's ``default`` (REPLY_MODE)."""
    asked: object = event.get_extension("replymode")
    if asked is None:
        # REPLY_MODE=async before the SinkBinding has injected K_SINK (the first revision
        # of a fresh install serves for a few seconds without it): reply in the HTTP
        # response, which a Trigger forwards to the Broker all the same.
        return default == "async" and bool(sink)
    if asked not in ("sync", "async"):
        raise InvalidRequest(f"replymode must be 'sync' or 'async', got {asked!r}")
    if asked == "async" and not sink:
        raise InvalidRequest("replymode async needs K_SINK, which this service lacks")
    return asked == "async"


def reply_data_of(event: CloudEvent) -> dict[str, Any]:
    data = event.get_data()
    return data if isinstance(data, dict) else {}


def to_http(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Binary-mode HTTP headers and body of an event."""
    message = to_binary_event(event)
    return dict(message.headers), message.body
