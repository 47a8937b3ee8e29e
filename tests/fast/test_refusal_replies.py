"""A refused request with a subject is answered by a failed reply event at K_SINK as well as
by its HTTP status (functions/http/refusals.py): behind a Broker, the status reaches no one,
and a sender waiting for replies by subject (the Tekton controller) would wait its timeout.
The sink is a real HTTP server on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from functions.events import to_http
from testbed.event_sink import EventSink
from tests.support.http_helpers import event

SUBJECT = "tekton.dev/customruns/team-a/pr-1-fetch"
SECRET = "refusal-canary-52e1"
MAIN = {"team": "main"}


def post(client: Any, **attributes: Any) -> Any:
    data = attributes.pop("data", None)
    headers, body = to_http(event("check", data, **attributes))
    return client.post("/", headers=headers, data=body)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"type": "nope", "source": {"password": SECRET}, "build": MAIN},
            "type 'nope' is not in the catalogue",
        ),
        ({"type": "mock", "source": {"token": "((missing))"}, "build": MAIN}, "((missing))"),
        (
            {"image": "registry.test/x:1", "source": {}, "build": MAIN},
            "not allowed here (ALLOWED_IMAGES)",
        ),
    ],
    ids=["unknown-type", "unresolvable-var", "image-not-allowed"],
)
def test_a_refused_request_with_a_subject_gets_a_failed_reply_too(
    client: Callable[..., Any], sink: EventSink, data: dict, said: str, tmp_path: Path
) -> None:
    credentials = {"credentials_provider": "dir", "credentials_dir": str(tmp_path)}
    answer = post(
        client("check", sink=sink.url, allowed_images=(), **credentials),
        data=data,
        subject=SUBJECT,
        team="main",
        id="rid-1",
    )
    assert answer.status_code == 400
    (reply,) = sink.drain()
    attributes = reply.get_attributes()
    assert attributes["type"] == "dev.resourcefunctions.check.failed"
    assert (attributes["requestid"], attributes["subject"]) == ("rid-1", SUBJECT)
    assert attributes["team"] == "main"
    assert attributes["source"] == "/resource-functions/check"
    error = reply.get_data()["error"]
    assert error["kind"] == "invalid_request" and said in error["message"]
    assert SECRET not in str(reply.get_data()), "a value of source never travels"


def test_the_same_refusal_delivered_again_is_the_same_reply(
    client: Callable[..., Any], sink: EventSink
) -> None:
    app = client("check", sink=sink.url)
    for _ in range(2):
        assert post(app, data={"type": "nope", "source": {}}, subject=SUBJECT).status_code == 400
    first, again = sink.drain()
    assert first.get_id() == again.get_id()


def test_no_reply_without_a_subject_or_without_a_sink(
    client: Callable[..., Any], sink: EventSink
) -> None:
    bad = {"type": "nope", "source": {}}
    assert post(client("check", sink=sink.url), data=bad).status_code == 400
    assert post(client("check"), data=bad, subject=SUBJECT).status_code == 400
    assert sink.drain() == []


def test_a_sink_that_refuses_the_reply_leaves_the_status_as_it_is(
    client: Callable[..., Any], sink: EventSink
) -> None:
    sink.status = 503
    answer = post(client("check", sink=sink.url), data={"type": "nope", "source": {}}, subject="s")
    assert answer.status_code == 400
