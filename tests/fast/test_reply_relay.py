"""The reply relay forwards an asynchronous run's events to its sink only with that run's
reply token and only for events its claims allow: a resource image (which holds no token) can
post nothing, and a token lets its holder post only its own run's reply and its check's
discoveries, for its own request, subject and team, until the run's deadline; never a
request. The sink is a real HTTP server on loopback."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from functions import keys
from functions.events import to_http
from functions.http.reply_relay import create_relay_app
from functions.model import HistoryPlan, Outcome, ReplyAddress
from functions.replies import reply_event, reply_events
from functions.sink import RUN_HEADER, RelayToken, post_events
from testbed.event_sink import EventSink

SECRET = b"relay-test-secret"
RUN, OTHER_RUN = "1" * 32, "2" * 32
RESOURCE = "k" * 64
SUBJECT = "tekton.dev/customruns/team-a/pr-1-check"


def claims(run: str = RUN, action: str = "check", **changes: Any) -> keys.ReplyClaims:
    given = keys.ReplyClaims(
        run=run,
        action=action,
        request_id="r",
        subject=SUBJECT,
        team="main",
        resource=RESOURCE if action == "check" else "",
        expires=int(time.time()) + 600,
    )
    return dataclasses.replace(given, **changes)


def token_of(given: keys.ReplyClaims, secret: bytes = SECRET) -> str:
    return keys.reply_token(secret, given)


def reply_of(run: str, action: str = "check", **changes: Any) -> CloudEvent:
    data: dict[str, Any] = (
        {"versions": [{"ref": "1"}]}
        if action == "check"
        else {"version": {"ref": "1"}, "metadata": []}
    )
    given: dict[str, Any] = {"request_id": "r", "subject": SUBJECT, "team": "main", **changes}
    return reply_event(
        action,  # type: ignore[arg-type]
        Outcome(action=action, data=data),  # type: ignore[arg-type]
        ReplyAddress(run_id=run, **given),
    )


def check_events(run: str, resource: str = RESOURCE, **changes: Any) -> list[CloudEvent]:
    """A check's events that found a new version: its discovered event, then its reply."""
    outcome = Outcome(action="check", data={"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})
    given: dict[str, Any] = {"request_id": "r", "subject": SUBJECT, "team": "main", **changes}
    return reply_events(
        "check", outcome, ReplyAddress(run_id=run, **given), HistoryPlan(resource, 10)
    )


def discovered_of(run: str, **changes: Any) -> CloudEvent:
    return check_events(run, **changes)[0]


def relay(client: Any, event: CloudEvent, run: str = RUN, token: str | bool | None = None) -> Any:
    headers, body = to_http(event)
    headers[RUN_HEADER] = run
    if token is not False:
        headers["Authorization"] = f"Bearer {token or token_of(claims(run))}"
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
    [
        False,
        "forged",
        token_of(claims(OTHER_RUN)),
        token_of(claims(), b"other"),
        token_of(claims(expires=int(time.time()) - 1)),
        token_of(claims()).replace(".", "x."),
        token_of(claims())[:-1] + "\u00e9",
    ],
    ids=[
        "no-token",
        "forged",
        "another-runs-token",
        "another-deployments",
        "expired",
        "altered",
        "non-ascii-signature",
    ],
)
def test_without_the_runs_token_nothing_is_forwarded(
    client: Any, sink: EventSink, token: Any
) -> None:
    response = relay(client, reply_of(RUN), token=token)
    assert response.status_code == 401
    assert sink.drain() == []


def test_a_token_posts_only_its_own_runs_reply(client: Any, sink: EventSink) -> None:
    response = relay(client, reply_of(OTHER_RUN), run=OTHER_RUN, token=token_of(claims()))
    assert response.status_code == 401  # the run header is not the token's run
    response = relay(client, reply_of(OTHER_RUN))  # another run's reply, with our token
    assert response.status_code == 403 and "not this run's reply" in response.get_data(True)
    assert sink.drain() == []


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (reply_of(RUN, team="blue"), "team"),
        (reply_of(RUN, team=""), "team"),
        (reply_of(RUN, subject="tekton.dev/customruns/team-b/theirs"), "subject"),
        (reply_of(RUN, request_id="their-request"), "requestid"),
        (reply_of(RUN, action="get"), "not this run's reply"),
        (discovered_of(RUN, team="blue"), "team"),
        (check_events(RUN, resource="o" * 64)[0], "resource"),
    ],
    ids=[
        "another-team",
        "no-team",
        "another-subject",
        "another-request",
        "another-action",
        "discovery-for-another-team",
        "discovery-of-another-resource",
    ],
)
def test_a_token_cannot_relabel_its_runs_events(
    client: Any, sink: EventSink, event: CloudEvent, why: str
) -> None:
    response = relay(client, event)
    assert response.status_code == 403 and why in response.get_data(True)
    assert sink.drain() == []


def test_a_discovery_whose_id_is_not_its_version_is_refused(client: Any, sink: EventSink) -> None:
    found = discovered_of(RUN)
    forged = CloudEvent(
        attributes=found.get_attributes(),
        data={"version": {"ref": "other"}, "resource": RESOURCE},
    )
    response = relay(client, forged)
    assert response.status_code == 403 and "version" in response.get_data(True)
    assert relay(client, found).status_code == 202


def test_a_get_runs_token_posts_no_discovery(client: Any, sink: EventSink) -> None:
    response = relay(client, discovered_of(RUN), token=token_of(claims(action="get")))
    assert response.status_code == 403 and "only a check" in response.get_data(True)
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
    assert response.status_code == 403 and "not this run's" in response.get_data(True)
    forged = CloudEvent(
        attributes={
            **forged.get_attributes(),
            "requestid": "r",
            "subject": SUBJECT,
            "team": "main",
        },
        data=forged.get_data(),
    )
    response = relay(client, forged)
    assert response.status_code == 403 and "not this run's reply" in response.get_data(True)
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
        token = RelayToken(RUN, token_of(claims()))
        post_events(url, [found, reply_of(RUN)], token)
    finally:
        server.shutdown()
    assert [e.get_id() for e in sink.drain()] == [found.get_id(), reply_of(RUN).get_id()]
    assert len(sink.peers) == 1  # the relay keeps its connection to the Broker


def test_a_runs_events_go_over_one_connection(sink: EventSink) -> None:
    """One connection (one name lookup) for a check's discoveries and its reply."""
    post_events(sink.url, [discovered_of(RUN), discovered_of(RUN), reply_of(RUN)])
    assert len(sink.drain()) == 3 and len(sink.peers) == 1


def test_the_token_a_runtime_mints_binds_the_runs_request_and_expires_with_its_job() -> None:
    """``job_launch.reply_claims``: what the Secret's token says of an async run's Job."""
    import dataclasses as dc

    from functions.runtimes.kube.job_launch import REPLY_GRACE_SECONDS, reply_claims
    from functions.steps.pod_contract import ReplyPlan
    from tests.support.job_plans import make_plan

    check = make_plan("check", reply=True)
    check = dc.replace(
        check,
        history=HistoryPlan(RESOURCE, 10),
        reply=ReplyPlan("evt-1", "pipelines/main", team="main"),
    )
    minted = reply_claims(check, 1000.0)
    assert minted == keys.ReplyClaims(
        run=check.run_id,
        action="check",
        request_id="evt-1",
        subject="pipelines/main",
        team="main",
        resource=RESOURCE,
        expires=1000 + check.active_deadline_seconds + REPLY_GRACE_SECONDS,
    )
    assert keys.reply_claims(SECRET, keys.reply_token(SECRET, minted)) == minted
    get = reply_claims(make_plan("get", reply=True), 0.0)
    assert (get.action, get.resource) == ("get", "")
