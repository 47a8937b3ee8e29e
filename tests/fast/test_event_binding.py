"""CloudEvents over HTTP: both content modes in, binary mode out, clear 400 reasons."""

import json

import pytest
from cloudevents.core.bindings.http import (
    HTTPMessage,
    from_http_event,
    to_binary_event,
    to_structured_event,
)
from cloudevents.core.v1.event import CloudEvent

from functions import events
from functions.errors import InvalidRequest
from functions.model import Failure, Outcome, ReplyAddress
from functions.replies import reply_event


def request(data, **attrs):
    attributes = {
        "specversion": "1.0",
        "type": "dev.resourcefunctions.check.requested",
        "source": "/test",
        "id": "abc",
        "datacontenttype": "application/json",
    }
    attributes.update(attrs)
    return CloudEvent(attributes=attributes, data=data)


@pytest.mark.parametrize(
    "encode", [to_binary_event, to_structured_event], ids=["binary", "structured"]
)
def test_both_content_modes_are_read(encode):
    message = encode(request({"type": "git", "source": {}}, subject="s1"))
    event = events.read_event(dict(message.headers), message.body)
    assert event.get_id() == "abc" and event.get_subject() == "s1"
    assert events.event_data(event) == {"type": "git", "source": {}}


@pytest.mark.parametrize(
    "headers, body, message",
    [
        pytest.param(
            {"content-type": "application/json"}, b"{}", "not a CloudEvent", id="plain-json"
        ),
        pytest.param(
            {
                "ce-specversion": "1.0",
                "ce-type": "t",
                "ce-id": "1",
                "content-type": "application/json",
            },
            b"{}",
            "source",
            id="no-source",
        ),
        pytest.param(
            {"content-type": "application/cloudevents+json"},
            b"{",
            "invalid CloudEvent",
            id="broken-structured",
        ),
        pytest.param(
            {"ce-specversion": "1.0"}, b"x" * (4 * 1024 * 1024 + 1), "larger than", id="too-large"
        ),
    ],
)
def test_malformed_events_are_rejected(headers, body, message):
    with pytest.raises(InvalidRequest, match=message):
        events.read_event(headers, body)


def test_data_that_is_not_json_is_rejected():
    message = to_binary_event(request({"a": 1}))
    event = events.read_event(dict(message.headers), b"{not json")
    with pytest.raises(InvalidRequest, match="data is not valid JSON"):
        events.event_data(event)


def test_wrong_type_for_service_is_rejected():
    with pytest.raises(InvalidRequest, match="this is the get service"):
        events.check_type(request({}), "get")


def test_success_reply_is_binary_json_with_requestid_and_subject():
    outcome = Outcome(action="check", data={"versions": [{"v": "1"}]})
    event = reply_event("check", outcome, ReplyAddress("abc", "r1", "pipe"))
    headers, body = events.to_http(event)
    assert headers["ce-type"] == "dev.resourcefunctions.check.succeeded"
    assert headers["ce-requestid"] == "abc" and headers["ce-subject"] == "pipe"
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"versions": [{"v": "1"}]}
    parsed = from_http_event(HTTPMessage(headers=headers, body=body))
    assert parsed.get_extension("requestid") == "abc"


def test_failure_reply_carries_error_kind_and_log_tail():
    failure = Failure(kind="resource_failed", message="exit 1", exit_code=1, log_tail="boom")
    event = reply_event("get", Outcome(action="get", failure=failure), ReplyAddress("x", "r"))
    headers, body = events.to_http(event)
    assert headers["ce-type"] == "dev.resourcefunctions.get.failed"
    assert "ce-subject" not in headers
    assert json.loads(body) == {
        "error": {
            "kind": "resource_failed",
            "message": "exit 1",
            "exit_code": 1,
            "log_tail": "boom",
        }
    }


def test_reply_id_is_stable_for_a_run():
    outcome = Outcome(action="check", data={"versions": []})
    ids = {reply_event("check", outcome, ReplyAddress("a", "r")).get_id() for _ in range(2)}
    assert len(ids) == 1


def test_check_also_takes_pingsource_ticks_and_nothing_else_does():
    tick = request({"type": "git", "source": {}}, type="dev.knative.sources.ping")
    events.check_type(tick, "check")
    with pytest.raises(InvalidRequest, match="this is the get service"):
        events.check_type(tick, "get")
