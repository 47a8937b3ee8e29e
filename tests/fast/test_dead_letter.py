"""The dead-letter service: what it logs of an undeliverable event, and what it answers."""

from __future__ import annotations

import json
import logging

from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.http.dead_letter import create_dead_letter_app
from functions.logs import SAFE_EXTRA

SECRET = "hunter2-in-the-data"


def undeliverable() -> CloudEvent:
    return CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.resourcefunctions.get.requested",
            "id": "dead-1",
            "source": "/pipelines/p",
            "datacontenttype": "application/json",
            "knativeerrorcode": "400",
        },
        data={"source": {"password": SECRET}},
    )


def test_an_event_is_taken_with_an_empty_answer_and_its_attributes_logged(caplog):
    """Knative's broker filter treats a non-empty answer that is not a CloudEvent as a failed
    delivery to the dead-letter sink and retries it: the answer must be empty."""
    message = to_binary_event(undeliverable())
    client = create_dead_letter_app().test_client()
    with caplog.at_level(logging.WARNING, logger="functions.http.dead_letter"):
        response = client.post("/", headers=dict(message.headers), data=message.body)
    assert response.status_code == 202
    assert response.data == b""
    [record] = [r for r in caplog.records if r.getMessage() == "undeliverable event"]
    logged = getattr(record, SAFE_EXTRA)
    assert logged["id"] == "dead-1" and logged["knativeerrorcode"] == "400"
    assert SECRET not in json.dumps(vars(record), default=str)


def test_a_request_that_is_no_event_is_refused_saying_why():
    client = create_dead_letter_app().test_client()
    response = client.post("/", data=b"not an event", headers={"content-type": "text/plain"})
    assert response.status_code == 400
    assert response.get_json()["error"]["kind"] == "invalid_request"
    assert response.get_json()["error"]["message"]
