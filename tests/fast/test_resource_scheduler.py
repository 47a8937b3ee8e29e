"""The Resources' scheduler in-process (functions/resources/scheduler.py): each Resource
checked once a slot, its status from the reply, a restart that neither skips a slot nor posts
a second request in one, pausing and deleting that stop the checks. The Kubernetes API is
testbed/tekton_fake_api.py (any custom object), the Broker a real HTTP sink; intervals
of a few seconds (``min_interval`` lowered), real time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from functions.model import ResourceType
from functions.resources import schedule
from functions.resources.decisions import API_VERSION, Context, condition_of
from functions.resources.scheduler import RateLimit, Scheduler
from functions.tekton.decide import Reply
from testbed.event_sink import EventSink
from testbed.tekton_fake_api import FakeTektonApi

IMAGE = "registry.test/mock@sha256:" + "b" * 64
SECRET = "literal-credential-in-a-source"


def context() -> Context:
    return Context(
        event_source="/resource-functions/tekton-controller",
        team_of=lambda namespace: "main" if namespace == "ci-main" else None,
        resource_types={"mock": ResourceType(image=IMAGE)},
        refusal=lambda namespace: f"namespace {namespace!r} serves no team",
        min_interval=1,
    )


def resource(name: str, namespace: str = "ci-main", every: str = "2s") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Resource",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {"type": "mock", "source": {"token": SECRET}, "checkEvery": every},
    }


class Scheduling:
    """A scheduler running in a thread until ``stop``."""

    def __init__(self, api: FakeTektonApi, sink: EventSink) -> None:
        self.api = api
        self.scheduler = Scheduler(api, context(), sink.url, rate=50)  # type: ignore[arg-type]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.scheduler.run, args=(self.stopped,))
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def api() -> FakeTektonApi:
    return FakeTektonApi()


@pytest.fixture
def running(api: FakeTektonApi, sink: EventSink) -> Iterator[Scheduling]:
    made = Scheduling(api, sink)
    yield made
    made.stop()


def wait(what: str, check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)
    return found


def posted(sink: EventSink, name: str) -> list[Any]:
    return [e for e in sink.events if e.get_attributes().get("subject", "").endswith(f"/{name}")]


def answer(scheduling: Scheduling, event: Any, versions: list[dict[str, str]]) -> None:
    """What the receiver does with the check function's reply to ``event``."""
    attributes = event.get_attributes()
    namespace, name = attributes["subject"].rsplit("/", 2)[-2:]
    reply = Reply(
        event.get_id(), True, {"versions": versions}, "check", "/resource-functions/check", "main"
    )
    scheduling.scheduler.reply(namespace, name, reply)


def slot_of(api: FakeTektonApi, event: Any) -> int:
    """The slot a posted request was claimed for (its id is the slot's)."""
    uid = api.runs[("ci-main", event.get_attributes()["subject"].rsplit("/", 1)[1])]["metadata"][
        "uid"
    ]
    for slot in range(int(time.time()) - 120, int(time.time()) + 5):
        if schedule.request_id(uid, slot) == event.get_id():
            return slot
    raise AssertionError(f"{event.get_id()} is no slot's id")


def test_a_resource_is_checked_each_slot_and_its_status_shows_the_new_version(
    api: FakeTektonApi, running: Scheduling, sink: EventSink
) -> None:
    api.create(resource("repo"))
    first = wait("the first check posted", lambda: posted(sink, "repo"))[0]
    assert first.get_data()["source"] == {"token": SECRET}  # the functions resolve and use it
    answer(running, first, [{"ref": "1"}])
    status = wait("the reply in the status", lambda: api.status_of("ci-main", "repo").get("latest"))
    assert status == "ref=1"
    second = wait(
        "the next slot's check",
        lambda: [e for e in posted(sink, "repo") if e.get_id() != first.get_id()],
    )[0]
    assert second.get_data()["version"] == {"ref": "1"}
    assert slot_of(api, second) - slot_of(api, first) == 2  # the next slot, none skipped
    answer(running, second, [{"ref": "1"}, {"ref": "2"}])
    wait("version 2", lambda: api.status_of("ci-main", "repo").get("latest") == "ref=2")
    status = api.status_of("ci-main", "repo")
    assert status["versionsSeen"] == 2 and (condition_of(status) or {})["reason"] == "Succeeded"
    assert SECRET not in json.dumps(status) + json.dumps(api.events)


def test_a_restart_neither_skips_a_slot_nor_posts_a_second_request_in_one(
    api: FakeTektonApi, sink: EventSink
) -> None:
    """Leader A claims and posts a slot and stops before its reply; leader B posts the same
    request again (the functions run one id once), and, once it is answered, the next slot's."""
    api.create(resource("repo", every="3s"))
    leader = Scheduling(api, sink)
    first = wait("A's check", lambda: posted(sink, "repo"))[0]
    leader.stop()
    successor = Scheduling(api, sink)
    try:
        wait("B's post of the claim", lambda: len(posted(sink, "repo")) >= 2)
        assert {e.get_id() for e in posted(sink, "repo")} == {first.get_id()}
        answer(successor, first, [{"ref": "1"}])
        following = wait(
            "the next slot's check",
            lambda: [e for e in posted(sink, "repo") if e.get_id() != first.get_id()],
        )
        assert slot_of(api, following[0]) - slot_of(api, first) == 3
    finally:
        successor.stop()
    by_slot: dict[int, set[str]] = {}
    for event in posted(sink, "repo"):
        by_slot.setdefault(slot_of(api, event), set()).add(event.get_id())
    assert all(len(ids) == 1 for ids in by_slot.values()), by_slot


def test_pausing_and_deleting_stop_the_checks_and_a_paused_one_keeps_its_status(
    api: FakeTektonApi, running: Scheduling, sink: EventSink
) -> None:
    for name in ("paused", "deleted"):
        api.create(resource(name, every="1s"))
        first = wait(f"{name}'s check", lambda n=name: posted(sink, n))[0]  # type: ignore[misc]
        answer(running, first, [{"ref": "7"}])
        wait(f"{name}'s status", lambda n=name: api.status_of("ci-main", n).get("latest"))  # type: ignore[misc]
    api.edit("ci-main", "paused", {"paused": True})
    api.delete("ci-main", "deleted")
    time.sleep(0.5)  # the watch delivers both
    counts = {name: len(posted(sink, name)) for name in ("paused", "deleted")}
    time.sleep(3)  # three of their slots
    assert {name: len(posted(sink, name)) for name in counts} == counts
    assert api.status_of("ci-main", "paused")["latest"] == "ref=7"


def test_a_resource_in_a_namespace_without_a_team_says_why_and_is_never_posted(
    api: FakeTektonApi, running: Scheduling, sink: EventSink
) -> None:
    api.create(resource("stray", namespace="nobodys"))
    status = wait("its status", lambda: api.status_of("nobodys", "stray"))
    condition = condition_of(status) or {}
    assert (condition["status"], condition["reason"]) == ("False", "NoTeam")
    assert "serves no team" in condition["message"]
    assert [e[2] for e in api.events if e[0] == "stray"] == ["NoTeam"]  # an Event, once
    time.sleep(1.5)
    assert posted(sink, "stray") == []


def test_the_rate_limit_spreads_a_backlog_at_the_rate_given() -> None:
    """After a restart every resource may be due at once: the posts go out at the rate (here
    20 a second, on a clock of the test's, which each wait moves on), none saved up."""
    now = [0.0]

    class Waiting(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            now[0] += timeout or 0.0
            return False

    limit = RateLimit(lambda: 20.0, clock=lambda: now[0])
    taken = []
    for _ in range(41):
        assert limit.take(Waiting())
        taken.append(now[0])
    assert taken[0] >= 0.05 and 1.95 <= taken[-1] - taken[0] <= 2.05
    stopped = threading.Event()
    stopped.set()
    assert not limit.take(stopped)
