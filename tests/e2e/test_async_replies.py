"""Asynchronous completion: 202 at once, then the reply event is POSTed to K_SINK."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.event_sink import EventSink, event_sink
from tests.support.events import request_event, send
from tests.support.runs import run_of
from tests.support.services import resource_types, start_services

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def replies():
    """The services' K_SINK for this module (``testbed.event_sink``)."""
    with event_sink() as sink:
        yield sink


@pytest.fixture(scope="module")
def async_services(replies, docker_host, resource_image, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("async")
    (tmp_path / "store").mkdir()
    services = start_services(
        {
            "DOCKER_HOST": docker_host,
            "RESOURCE_TYPES": resource_types(resource_image),
            "STORE_URL": (tmp_path / "store").as_uri(),
            "K_SINK": replies.url,
            "CACHE_SECRET": "e2e-async",
        },
        tmp_path / "services.log",
        actions=("check",),
    )
    yield services
    services.stop()


def test_async_request_is_accepted_then_replied_to_the_sink(async_services, replies):
    event = request_event(
        "check", {"type": "test", "source": {"count": 2}}, subject="async/one", replymode="async"
    )
    status, _, response = send(async_services.urls["check"], event)
    assert status == 202 and response.content == b""
    *_, reply = events_until_reply(replies)
    assert reply.get_type() == "dev.resourcefunctions.check.succeeded"
    assert reply.get_extension("requestid") == event.get_id()
    assert reply.get_subject() == "async/one"
    assert reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}]


def events_until_reply(replies: EventSink) -> list:
    """The events posted up to and including the next reply (discoveries come first)."""
    events = [replies.next()]
    while not events[-1].get_type().endswith((".succeeded", ".failed")):
        events.append(replies.next())
    return events


def test_async_check_posts_each_new_version_then_its_reply(async_services, replies):
    source = {"count": 3, "nonce": uuid.uuid4().hex}
    first = request_event(
        "check", {"type": "test", "source": source}, replymode="async", traceparent=PARENT
    )
    assert send(async_services.urls["check"], first)[0] == 202
    *found, reply = events_until_reply(replies)
    assert [e.get_type() for e in found] == ["dev.resourcefunctions.version.discovered"] * 3
    assert [e.get_data()["version"] for e in found] == reply.get_data()["new"]
    assert reply.get_data()["new"] == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]
    assert {e.get_extension("requestid") for e in found} == {first.get_id()}
    assert {e.get_extension("traceparent") for e in [*found, reply]} == {PARENT}

    again = request_event(
        "check", {"type": "test", "source": source, "version": "latest-known"}, replymode="async"
    )
    assert send(async_services.urls["check"], again)[0] == 202
    assert [e.get_data() for e in events_until_reply(replies)] == [
        {"versions": [{"ref": "3"}], "new": []}  # the script got ref 3; nothing discovered
    ]


def test_an_async_checks_discoveries_and_reply_carry_its_team(async_services, replies):
    source = {"count": 2, "nonce": uuid.uuid4().hex}
    request = request_event(
        "check", {"type": "test", "source": source, "build": {"team": "a"}}, replymode="async"
    )
    assert send(async_services.urls["check"], request)[0] == 202
    posted = events_until_reply(replies)
    assert [e.get_type() for e in posted[:-1]] == ["dev.resourcefunctions.version.discovered"] * 2
    assert [e.get_extension("team") for e in posted] == ["a", "a", "a"]


def test_identical_async_checks_run_once_and_the_waiter_answers_in_its_response(
    async_services, replies
):
    """The check lease with the container runtime: the check that takes it gets 202 and its
    container's task posts the reply; the identical one waits for it and answers with 200
    (as it would on another replica); the task released the lease."""
    from storage import open_store

    source = {"count": 2, "delay": 2, "nonce": uuid.uuid4().hex}
    requests = [
        request_event("check", {"type": "test", "source": source}, replymode="async")
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda e: send(async_services.urls["check"], e), requests))

    assert sorted(status for status, _, _ in answers) == [200, 202]
    (waiter,) = [response for status, _, response in answers if status == 200]
    # From the history, as any check that shares another's run: from no version, the latest.
    assert waiter.json() == {"versions": [{"ref": "2"}], "new": []}
    *_, reply = events_until_reply(replies)
    assert reply.get_data() == {
        "versions": [{"ref": "1"}, {"ref": "2"}],
        "new": [{"ref": "1"}, {"ref": "2"}],
    }
    assert replies.drain() == []  # one task, one reply
    store = open_store(async_services.env["STORE_URL"])
    runs = {
        run_of(async_services.env["CACHE_SECRET"], e.get_source(), e.get_id(), "check")
        for e in requests
    }
    leases = [json.loads(store.read_record(key).data) for key in store.list("leases/")]
    (held,) = [record for record in leases if record["run"] in runs]
    assert held["released"] is True


def test_async_failure_is_replied_as_failed_event(async_services, replies):
    event = request_event("check", {"type": "test", "source": {"mode": "fail"}}, replymode="async")
    assert send(async_services.urls["check"], event)[0] == 202
    reply = replies.next()
    assert reply.get_type() == "dev.resourcefunctions.check.failed"
    assert reply.get_data()["error"]["kind"] == "resource_failed"
    # Counted as a run like a synchronous one (before its reply was posted).
    runs = async_services.metric("check", "resource_function_runs_total", outcome="resource_failed")
    assert runs == 1
    assert async_services.metric("check", "resource_function_run_duration_seconds_count") >= 1


def test_bad_replymode_is_rejected(async_services):
    event = request_event("check", {"type": "test", "source": {}}, replymode="later")
    status, _, response = send(async_services.urls["check"], event)
    assert status == 400 and "replymode" in response.json()["error"]["message"]


def test_async_without_sink_is_rejected(docker_host, resource_image, tmp_path):
    (tmp_path / "store").mkdir()
    services = start_services(
        {
            "DOCKER_HOST": docker_host,
            "RESOURCE_TYPES": resource_types(resource_image),
            "STORE_URL": (tmp_path / "store").as_uri(),
        },
        tmp_path / "log",
        actions=("check",),
    )
    try:
        event = request_event("check", {"type": "test", "source": {}}, replymode="async")
        status, _, response = send(services.urls["check"], event)
        assert status == 400 and "K_SINK" in response.json()["error"]["message"]
    finally:
        services.stop()
