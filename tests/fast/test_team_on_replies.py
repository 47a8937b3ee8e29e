"""Every reply and ``version.discovered`` event carries the ``team`` extension attribute of its
request (``build.team``), so a Trigger can route a team's replies to that team's engine
alone: answered by the service (both ways of the get service), and posted by an
asynchronous task (the collect step's arguments carry the team into the task pod)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from functions.model import Outcome, ReplyAddress, ResourceType, Task
from functions.replies import reply_events
from functions.runtimes.kube.job_plan import KubernetesConfig, plan_for
from functions.runtimes.kube.podspec import job_manifest
from functions.sink import post_outcome
from functions.steps.pod_contract import CollectStep
from storage import Store, open_store
from testbed.event_sink import EventSink, event_sink
from testbed.repository_runtime import RepositoryRuntime
from tests.support.http_helpers import (
    FakeRuntime,
    cache_entry,
    check_client,
    event,
    make_client,
    post,
    reply_of,
)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "store").mkdir()
    return open_store((tmp_path / "store").as_uri())


@pytest.fixture
def sink() -> Iterator[EventSink]:
    with event_sink() as running:
        yield running


def teams_of(events: list[CloudEvent]) -> list[Any]:
    return [e.get_extension("team") for e in events]


def test_a_checks_reply_and_its_discovered_versions_carry_its_team(
    store: Store, sink: EventSink
) -> None:
    functions = check_client(store, RepositoryRuntime(store), sink.url)
    request = event(
        "check", {"type": "git", "source": {"uri": "x"}, "build": {"team": "team-a"}}, id="c-1"
    )

    answer = post(functions, request)

    assert answer.status_code == 200
    discovered = sink.drain()
    assert [e.get_type() for e in discovered] == ["dev.resourcefunctions.version.discovered"]
    assert teams_of([reply_of(answer), *discovered]) == ["team-a", "team-a"]


def test_a_request_naming_no_team_is_answered_without_the_attribute(store: Store) -> None:
    answer = post(make_client(store, "check", FakeRuntime(store)), event("check"))

    assert answer.status_code == 200
    assert "team" not in reply_of(answer).get_attributes()


def test_both_ways_of_the_get_service_answer_with_the_team(store: Store) -> None:
    functions = make_client(store, "get", FakeRuntime(store))
    data = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}
    answers = [
        post(functions, event("get", {**data, "build": {"team": "team-a"}}, id=f"g-{n}"))
        for n in range(3)  # a miss, a hit by the full way, then repeats by the short way
    ]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert teams_of([reply_of(a) for a in answers]) == ["team-a"] * 3


def test_the_short_way_answers_each_team_with_its_own(store: Store) -> None:
    functions = make_client(store, "get", FakeRuntime(store))
    data = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}
    from functions import keys

    cache_entry(
        store,
        keys.cache_key(
            b"k" * 32,
            image="example.org/mock-resource@sha256:" + "a" * 64,
            source={"uri": "x"},
            version={"ref": "v1"},
            params={},
        ),
    )
    for team in ("team-a", "team-b", "team-a", "team-b"):
        answer = post(functions, event("get", {**data, "build": {"team": team}}, id="same"))
        assert reply_of(answer).get_extension("team") == team


TASK = Task(
    run_id="a" * 32,
    action="get",
    resource_type=ResourceType(image="example.org/git@sha256:" + "b" * 64),
    stdin=b"{}",
    env={},
    inputs={},
    cache_key="c" * 64,
    timeout_seconds=60,
    request_id="evt-1",
    team="team-a",
)


def test_an_asynchronous_tasks_events_carry_its_team(sink: EventSink) -> None:
    post_outcome(sink.url, TASK, Outcome(action="get", data={"version": {"ref": "1"}}))

    assert teams_of(sink.drain()) == ["team-a"]


def test_the_collect_step_of_a_task_pod_is_told_the_team() -> None:
    config = KubernetesConfig(namespace="tasks", service_account="task", task_image="rf:test")
    job = job_manifest(plan_for(TASK, config, "s3://bucket/ci", reply=True))
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    step = CollectStep.parse(command[command.index("collect") + 1 :])

    assert step.reply is not None and step.reply.team == "team-a"
    address = ReplyAddress("evt-1", TASK.run_id, team=step.reply.team)
    events = reply_events("get", Outcome(action="get", data={}), address, None)
    assert teams_of(events) == ["team-a"]
