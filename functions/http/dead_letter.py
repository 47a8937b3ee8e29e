"""The dead-letter service: logs the attributes of events the Broker could not deliver.

Their data may hold credentials, so it is never logged or stored; the attributes (type, id,
source, subject and Knative's knativeerror* extensions) are enough to find the request.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, request

from functions import events
from functions.errors import InvalidRequest
from functions.logs import fields

log = logging.getLogger("functions.http.dead_letter")


def create_dead_letter_app() -> Flask:
    app = Flask("resource-functions-dead-letter")
    app.add_url_rule("/", "event", _receive, methods=["POST"])
    app.add_url_rule("/healthz", "healthz", lambda: {"status": "ok", "action": "dead-letter"})
    return app


def _receive() -> tuple[dict[str, Any] | str, int]:
    try:
        event = events.read_event(dict(request.headers), request.get_data())
    except InvalidRequest as err:
        return {"error": {"kind": "invalid_request", "message": str(err)}}, 400
    attributes = {k: str(v) for k, v in event.get_attributes().items() if k != "data"}
    log.warning("undeliverable event", extra=fields(**attributes))
    # Empty: Knative's broker filter takes a non-empty answer that is not a CloudEvent for a
    # failed delivery, and sends the event to this sink again and again.
    return "", 202
