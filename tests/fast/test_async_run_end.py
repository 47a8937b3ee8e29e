"""The end of an asynchronous run, one function for every runtime
(``runtimes.background.end_async_run``): its lease rule, its report, its reply."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from functions.errors import Unavailable
from functions.ledger import lease
from functions.model import LeaseHold, Outcome
from functions.runtimes.background import AsyncEnd, InRequest, end_async_run
from storage import Store
from testbed.event_sink import event_sink
from tests.support.job_plans import make_task

KEY = "leases/" + "r" * 64 + ".json"
OUTCOME = Outcome(action="get", data={"version": {"ref": "v1"}, "metadata": []})


def held_task(store: Store) -> tuple[object, LeaseHold]:
    claim = lease.take(store, KEY, None, run="run-1", ttl=600, now=time.time())
    assert claim is not None
    hold = LeaseHold(key=KEY, holder=claim.lease.holder)
    return replace(make_task("get"), lease=hold), hold


def test_an_ended_run_lets_go_of_its_lease_reports_once_and_posts_its_reply(store: Store) -> None:
    task, _ = held_task(store)
    reported: list[Outcome] = []
    with event_sink() as sink:
        end_async_run(store, sink.url, task, OUTCOME, reported.append)  # type: ignore[arg-type]
        events = sink.drain()
    claim = lease.read(store, KEY)
    assert claim is not None and claim.lease.released
    assert reported == [OUTCOME]
    assert [event.get_type() for event in events] == ["dev.resourcefunctions.get.succeeded"]
    assert events[0].get_extension("requestid") == task.request_id


def test_a_task_that_may_still_run_keeps_its_lease(store: Store) -> None:
    task, hold = held_task(store)
    with event_sink() as sink:
        end_async_run(store, sink.url, task, OUTCOME, None, AsyncEnd.MAY_STILL_RUN)  # type: ignore[arg-type]
        assert len(sink.drain()) == 1  # the requester still hears of the failure to follow
    claim = lease.read(store, KEY)
    assert claim is not None and claim.lease.holder == hold.holder
    assert not claim.lease.released


def test_a_task_that_replied_itself_is_not_answered_twice(store: Store) -> None:
    task, _ = held_task(store)
    reported: list[Outcome] = []
    with event_sink() as sink:
        end_async_run(store, sink.url, task, OUTCOME, reported.append, AsyncEnd.COLLECT_REPLIED)  # type: ignore[arg-type]
        assert sink.drain() == []
    assert reported == [OUTCOME]


def test_a_refused_reply_is_logged_after_a_202_and_a_503_within_the_request(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    task, _ = held_task(store)
    with event_sink() as sink:
        sink.status = 500
        end_async_run(store, sink.url, task, OUTCOME, None)  # type: ignore[arg-type]
        assert "cannot post the reply" in caplog.text
        with pytest.raises(Unavailable, match="cannot post the reply"):
            end_async_run(store, sink.url, task, OUTCOME, None, AsyncEnd.IN_REQUEST)  # type: ignore[arg-type]


def test_a_failing_report_never_stops_the_reply(store: Store) -> None:
    task, _ = held_task(store)

    def broken(outcome: Outcome) -> None:
        raise RuntimeError("metrics are down")

    with event_sink() as sink:
        end_async_run(store, sink.url, task, OUTCOME, broken)  # type: ignore[arg-type]
        assert len(sink.drain()) == 1


def test_a_run_in_its_request_has_posted_its_reply_before_it_returns(store: Store) -> None:
    """A warm check's way (``InRequest``): when ``start`` returns (the 202), its reply is
    posted and its lease gone, so a crash after the 202 loses nothing."""
    task, _ = held_task(store)
    reported: list[Outcome] = []
    with event_sink() as sink:
        ran = InRequest().run(store, sink.url, task, reported.append, lambda: OUTCOME)  # type: ignore[arg-type]
        events = sink.drain()
    assert ran is True
    assert [event.get_extension("requestid") for event in events] == [task.request_id]
    claim = lease.read(store, KEY)
    assert claim is not None and claim.lease.released
    assert reported == [OUTCOME]


def test_a_run_that_cannot_go_in_its_request_leaves_the_task_to_start_as_any(store: Store) -> None:
    task, hold = held_task(store)
    with event_sink() as sink:
        ran = InRequest().run(store, sink.url, task, None, lambda: None)  # type: ignore[arg-type]
        assert sink.drain() == []
    assert ran is False
    claim = lease.read(store, KEY)
    assert claim is not None and claim.lease.holder == hold.holder and not claim.lease.released


def test_a_redelivery_while_its_run_is_under_way_is_503_and_later_ones_run(store: Store) -> None:
    task, _ = held_task(store)
    in_request = InRequest()
    refused: list[str] = []

    def run() -> Outcome:
        with pytest.raises(Unavailable, match="under way here") as err:
            in_request.run(store, sink.url, task, None, lambda: OUTCOME)  # type: ignore[arg-type]
        refused.append(str(err.value))
        return OUTCOME

    def broken() -> Outcome:
        raise Unavailable("the agent's stream was cut")

    with event_sink() as sink:
        assert in_request.run(store, sink.url, task, None, run)  # type: ignore[arg-type]
        assert len(refused) == 1 and len(sink.drain()) == 1
        with pytest.raises(Unavailable, match="cut"):
            in_request.run(store, sink.url, task, None, broken)  # type: ignore[arg-type]
        assert in_request.run(store, sink.url, task, None, lambda: OUTCOME)  # type: ignore[arg-type]
        assert len(sink.drain()) == 1
