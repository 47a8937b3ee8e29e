"""The reply relay forwards an asynchronous run's events to its sink only with that run's
reply token and only for events of that run: a resource image (which holds no token) can
post nothing, and a token lets its holder post only its own run's reply and discoveries,
never a request. The sink is a real HTTP server on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from functions import keys
from functions.events import to_http
from functions.http.reply_relay import create_relay_app
from functions.model import HistoryPlan, Outcome
from functions.replies import reply_event, reply_events
from functions.sink import RUN_HEADER, RelayToken, post_events
from testbed.event_sink import EventSink

SECRET = b"relay-test-secret"
RUN, OTHER_RUN = "1" * 32, "2" * 32


def reply_of(run: str) -> CloudEvent:
    outcome = Outcome(action="get", data={"version": {"ref": "1"}, "metadata": []})
    return reply_event(action="get", outcome=outcome, request_id="r", subject=None, run_id=run)


def check_events(run: str) -> list[CloudEvent]:
    """A check's events that found a new version: its discovered event, then its reply."""
    outcome = Outcome(action="check", data={"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})
    return reply_events(
        action="check",
        outcome=outcome,
        request_id="r",
        subject=None,
        run_id=run,
        history=HistoryPlan("k" * 64, 10),
    )


def discovered_of(run: str) -> CloudEvent:
    return check_events(run)[0]


def relay(client: Any, event: CloudEvent, run: str = RUN, token: str | None = None) -> Any:
    headers, body = to_http(event)
    headers[RUN_HEADER] = run
    if token is not False:
        headers["Authorization"] = f"Bearer {token or keys.reply_token(SECRET, run)}"
    return client.post("/", headers=headers, data=body)


@pytest.fixture
def client(sink: EventSink) -> Any:
    return create_relay_app(SECRET, sink.url).test_client()


def test_a_runs_reply_with_its_token_is_forwarded_as_it_is(client: Any, sink: EventSink) -> None:
    event = reply_of(RUN)
    response = relay(client, event)
    assert response.status_code == 202
    (forwarded,) = sink.drain()
    assert (forwarded.get_id(), forwarded.get_type()) == (event.get_id(), event.get_type())
    assert forwarded.get_data() == event.get_data()


def test_discovered_versions_of_a_check_are_forwarded(client: Any, sink: EventSink) -> None:
    events = check_events(RUN)
    assert [relay(client, e).status_code for e in events] == [202, 202]
    assert [e.get_type().rsplit(".", 1)[-1] for e in sink.drain()] == ["discovered", "succeeded"]


@pytest.mark.parametrize(
    "token",
    [False, "forged", keys.reply_token(SECRET, OTHER_RUN), keys.reply_token(b"other", RUN)],
    ids=["no-token", "forged", "another-runs-token", "another-deployments-token"],
)
def test_without_the_runs_token_nothing_is_forwarded(
    client: Any, sink: EventSink, token: Any
) -> None:
    response = relay(client, reply_of(RUN), token=token)
    assert response.status_code == 401
    assert sink.drain() == []


def test_a_token_posts_only_its_own_runs_reply(client: Any, sink: EventSink) -> None:
    response = relay(client, reply_of(OTHER_RUN))  # another run's reply, with our token
    assert response.status_code == 403 and "not this run's reply" in response.get_data(True)
    assert sink.drain() == []


def test_a_token_never_posts_a_request(client: Any, sink: EventSink) -> None:
    forged = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.resourcefunctions.check.requested",
            "source": "/forged",
            "id": "x",
            "datacontenttype": "application/json",
            "team": "blue",
        },
        data={"type": "git", "source": {"uri": "https://attacker.example/((token))"}},
    )
    response = relay(client, forged)
    assert response.status_code == 403 and "not a reply" in response.get_data(True)
    assert sink.drain() == []


def test_a_sink_that_refuses_is_503_so_collect_tries_again(client: Any, sink: EventSink) -> None:
    sink.status = 503
    response = relay(client, reply_of(RUN))
    assert response.status_code == 503


def test_collect_posts_through_the_relay_with_its_token(sink: EventSink) -> None:
    """The collect side (``sink.post_events`` with a ``RelayToken``) against the relay
    served on loopback, forwarding to the real sink."""
    import threading

    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, create_relay_app(SECRET, sink.url))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    found = discovered_of(RUN)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        token = RelayToken(RUN, keys.reply_token(SECRET, RUN))
        post_events(url, [found, reply_of(RUN)], token)
    finally:
        server.shutdown()
    assert [e.get_id() for e in sink.drain()] == [found.get_id(), reply_of(RUN).get_id()]
    assert len(sink.peers) == 1  # the relay keeps its connection to the Broker


def test_a_runs_events_go_over_one_connection(sink: EventSink) -> None:
    """One connection (one name lookup) for a check's discoveries and its reply."""
    post_events(sink.url, [discovered_of(RUN), discovered_of(RUN), reply_of(RUN)])
    assert len(sink.drain()) == 3 and len(sink.peers) == 1
