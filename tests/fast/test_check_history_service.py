"""Checks that remember, through the HTTP layer and the Service in-process: a runtime whose
"script" lists the commits of an in-memory repository (``testbed.repository_runtime``), the file
store, and a real HTTP sink for the ``version.discovered`` events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from storage import Store, open_store
from testbed.event_sink import EventSink
from testbed.repository_runtime import RepositoryRuntime
from tests.support.check_replicas import send
from tests.support.http_helpers import check_client as client

SECRET = "s3cret-token-value"
DISCOVERED = "dev.resourcefunctions.version.discovered"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "store").mkdir()
    return open_store((tmp_path / "store").as_uri())


def tick(test_client: Any, event_id: str, **data: Any) -> tuple[int, dict[str, Any]]:
    request = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.knative.sources.ping",
            "source": "/apis/v1/namespaces/ci/pingsources/repo",
            "id": event_id,
            "subject": "main/repo",
            "datacontenttype": "application/json",
        },
        data={"type": "git", "source": {"uri": "x", "token": SECRET}, **data},
    )
    return send(test_client, request)


def refs(versions: list[dict[str, str]]) -> list[str]:
    return [v["ref"] for v in versions]


def test_commits_between_two_ticks_are_new_and_each_is_announced(
    store: Store, sink: EventSink
) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime, sink.url)

    assert tick(functions, "tick-1", version="latest-known") == (
        200,
        {"versions": [{"ref": "1"}], "new": [{"ref": "1"}]},
    )
    runtime.commits += ["2", "3"]
    status, data = tick(functions, "tick-2", version="latest-known")

    assert runtime.stdins[0]["version"] is None  # no history yet: a first check
    assert runtime.stdins[1]["version"] == {"ref": "1"}  # continued from the history
    assert (status, refs(data["versions"]), refs(data["new"])) == (200, ["1", "2", "3"], ["2", "3"])
    events = sink.drain()
    assert [(e.get_type(), e.get_data()["version"]["ref"]) for e in events] == [
        (DISCOVERED, "1"),
        (DISCOVERED, "2"),
        (DISCOVERED, "3"),
    ]
    assert {e.get_extension("requestid") for e in events[1:]} == {"tick-2"}
    assert {e.get_subject() for e in events} == {"main/repo"}
    assert len({e.get_id() for e in events}) == 3
    assert not [body for body in sink.bodies if SECRET.encode() in body]


def test_a_redelivered_tick_replays_its_answer_and_the_same_events(
    store: Store, sink: EventSink
) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime, sink.url)
    runtime.commits += ["2"]

    first = tick(functions, "tick-1")
    first_events = sink.drain()
    again = tick(functions, "tick-1")

    assert again == first and refs(first[1]["new"]) == ["2"]
    assert len(runtime.stdins) == 1
    assert [e.get_id() for e in sink.drain()] == [e.get_id() for e in first_events]


def test_a_sink_that_refuses_the_events_makes_a_503_and_the_redelivery_sends_them(
    store: Store, sink: EventSink
) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime, sink.url)
    sink.status = 400

    assert tick(functions, "tick-1")[0] == 503
    sink.status = 202
    status, data = tick(functions, "tick-1")

    assert (status, refs(data["new"])) == (200, ["1"])
    assert [e.get_data()["version"] for e in sink.drain()] == [{"ref": "1"}]
    assert len(runtime.stdins) == 1


def test_without_a_sink_the_reply_alone_lists_the_new_versions(store: Store) -> None:
    runtime = RepositoryRuntime(store)

    status, data = tick(client(store, runtime), "tick-1")

    assert (status, data) == (200, {"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})


def test_a_check_within_the_type_interval_is_answered_from_the_history(store: Store) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime, check_every=3600)
    tick(functions, "tick-1", version="latest-known")
    runtime.commits += ["2"]

    answered = tick(functions, "tick-2", version="latest-known")
    overridden = tick(functions, "tick-3", version="latest-known", check_every=0)

    assert answered == (200, {"versions": [{"ref": "1"}], "new": []})
    assert overridden == (200, {"versions": [{"ref": "1"}, {"ref": "2"}], "new": [{"ref": "2"}]})
    assert len(runtime.stdins) == 2  # tick-2 ran nothing


def test_a_request_interval_applies_without_a_type_interval(store: Store) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime)
    tick(functions, "tick-1")

    assert tick(functions, "tick-2", check_every=3600) == (
        200,
        {"versions": [{"ref": "1"}], "new": []},
    )
    assert len(runtime.stdins) == 1


def test_identical_checks_that_join_one_run_announce_each_version_once(
    store: Store, sink: EventSink
) -> None:
    """Three identical checks (distinct event ids) arriving together share one run on this
    replica: each version found is one version.discovered event, with one id per (resource,
    version), sent by the check whose run added it to the history, not once per joiner."""
    from concurrent.futures import ThreadPoolExecutor

    runtime = RepositoryRuntime(store, seconds=0.5)
    runtime.commits += ["2"]
    functions = client(store, runtime, sink.url)

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda n: tick(functions, f"tick-{n}"), range(3)))

    assert [status for status, _ in answers] == [200, 200, 200]
    assert len(runtime.stdins) == 1  # one run for the three
    events = sink.drain()
    assert [e.get_data()["version"] for e in events] == [{"ref": "2"}]
    assert len({e.get_id() for e in events}) == 1
