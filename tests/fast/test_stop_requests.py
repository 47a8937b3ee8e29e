"""Stop requests (functions/service/stop_requests.py): a sender stops a request it sent; a
stop that comes first keeps the request from ever running, and nobody stops another sender's
or another team's run."""

from __future__ import annotations

from typing import Any

import pytest

from functions.errors import RunStopped
from functions.ledger import tombstones
from functions.phases import PhaseClock
from functions.runtimes.output import Output
from functions.runtimes.warm.check import check_in_warm
from functions.runtimes.warm.pool import Slot, WarmPool
from functions.settings import WarmLimits
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post, reply_of

GET = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}


def stop_of(action: str, request_id: str, **attributes: Any) -> Any:
    return event(action, data={}, id=f"stop-{request_id}", stops=request_id, **attributes)


def test_a_stop_before_its_request_keeps_it_from_ever_running(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "get", runtime)
    stopped = post(client, stop_of("get", "evt-1"))
    assert (stopped.status_code, stopped.data) == (200, b"")
    ((run, action),) = runtime.stopped
    assert action == "get" and tombstones.stopped(store, run)
    for _ in range(2):  # the request, then its redelivery
        answered = post(client, event("get", id="evt-1", data=GET))
        assert (answered.status_code, answered.data) == (200, b"")
    assert runtime.ran == [] and runtime.started == []


def test_a_stopped_async_request_starts_nothing(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime, sink="http://127.0.0.1:9")
    assert post(client, stop_of("check", "evt-1")).status_code == 200
    answered = post(client, event("check", id="evt-1", replyasync="true"))
    assert (answered.status_code, answered.data) == (200, b"")
    assert runtime.started == [] and runtime.ran == []


def test_a_stop_names_one_run_only_its_source_and_team(store: Store) -> None:
    """Another source's or another team's request of the same id runs: a stop's run is
    (sender, team, source, id), as the request's."""
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime)
    assert post(client, stop_of("check", "evt-1", team="blue")).status_code == 200
    elsewhere = post(client, event("check", id="evt-1", source="/other"))
    assert reply_of(elsewhere).get_type() == "dev.resourcefunctions.check.succeeded"
    no_team = post(client, event("check", id="evt-1"))  # the stop named team blue
    assert reply_of(no_team).get_type() == "dev.resourcefunctions.check.succeeded"
    assert len(runtime.ran) == 2


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        ({"stops": ""}, "'stops' attribute must be the id of a request"),
        ({"stops": "x" * 1025}, "'stops' attribute is longer than 1024"),
        ({"stops": "evt-9", "id": "evt-9"}, "a stop's own id cannot be the 'stops' it names"),
        ({"stops": "evt-1", "type": "dev.resourcefunctions.get.requested"}, "event type must"),
    ],
)
def test_a_bad_stop_is_400_saying_why_and_stops_nothing(
    store: Store, attributes: dict[str, str], problem: str
) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime)
    refused = post(client, event("check", data={}, **{"id": "s-1", **attributes}))
    assert refused.status_code == 400
    assert problem in refused.get_json()["error"]["message"]
    assert runtime.stopped == []


def test_a_stop_is_never_answered_as_a_repeated_get(store: Store) -> None:
    """The get service's short way for repeats (http/repeated_gets.py) leaves a stop to the
    full way, even one whose body is a get it has seen."""
    runtime = FakeRuntime(store)
    client = make_client(store, "get", runtime)
    assert post(client, event("get", id="evt-1", data=GET)).status_code == 200
    assert post(client, event("get", id="evt-2", data=GET)).status_code == 200
    stop = post(client, event("get", id="evt-3", data=GET, stops="evt-4"))
    assert (stop.status_code, stop.data) == (200, b"")
    assert len(runtime.stopped) == 1


def test_a_stop_counts_in_the_metrics(store: Store) -> None:
    client = make_client(store, "put", FakeRuntime(store))
    post(client, stop_of("put", "evt-1"))
    text = client.get("/metrics").data.decode()
    assert 'resource_function_stops_total{action="put"} 1.0' in text


# --- the warm check under way -----------------------------------------------------------------


def test_stopping_a_warm_check_under_way_ends_it_alone_and_never_runs_it_again() -> None:
    """The stop ends that check (its slot's ``cancel``: the agent kills its processes); the
    warm container stays, with its other sources' checks."""
    removed: list[str] = []
    pool = WarmPool(WarmLimits(), removed.append)
    other = pool.take("k", "t", "other-source", run="run-0")
    container = pool.admit(other, "c-1")
    ended: list[str] = []

    def execute(slot: Slot) -> tuple[int | None, Output]:
        slot.cancel = lambda: ended.append(slot.source)
        assert pool.stop_run("run-1")  # the stop arrives while the check runs
        return None, Output()

    with pytest.raises(RunStopped, match="stopped by its sender"):
        check_in_warm(
            pool,
            lambda: pool.take("k", "t", "source-1", run="run-1"),
            PhaseClock(),
            start=lambda slot: pool.admit(slot, "c-2"),
            execute=execute,
        )
    assert ended == ["source-1"] and removed == []
    assert list(container.checks) == ["other-source"]  # the other check goes on
    assert not pool.stop_run("run-1")


def test_a_stop_of_a_run_without_a_warm_check_here_changes_nothing() -> None:
    removed: list[str] = []
    pool = WarmPool(WarmLimits(), removed.append)
    slot = pool.take("k", "t", "s", run="run-1")
    pool.admit(slot, "c-1")
    assert not pool.stop_run("run-2")
    pool.back(slot)
    assert not pool.stop_run("run-1")  # idle: no check of it under way
    assert removed == []
