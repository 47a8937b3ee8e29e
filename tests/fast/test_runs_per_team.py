"""``MAX_RUNS_PER_TEAM``: a team has at most that many runs in flight on a replica; over it a
request is answered 429 with ``Retry-After`` (the Broker retries it) before any container or
Job is created, in both reply modes, while other teams run. Through the HTTP layer and the
Service with the fake runtime and the file store."""

from __future__ import annotations

import threading
from typing import Any

from functions.cli.launch import wait_until
from functions.model import Outcome, Task
from functions.settings import Settings
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post

SINK = "http://sink.example"


def check(team: str, n: int, **attributes: Any) -> Any:
    data = {"type": "mock", "source": {"uri": f"r{n}"}, "build": {"team": team}}
    return event("check", data, id=f"{team}-{n}", **attributes)


class Ending(FakeRuntime):
    """Starts tasks and keeps their ``ended`` callbacks, to end them when told."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.ends: list[Any] = []

    def start(self, task: Task, ended: Any = None) -> None:
        super().start(task, ended)
        self.ends.append(lambda: ended(Outcome(action=task.action, data={"versions": []})))


def test_an_asynchronous_start_over_the_teams_limit_is_429_and_starts_nothing(
    store: Store,
) -> None:
    runtime = Ending(store)
    functions = make_client(store, "check", runtime, sink=SINK, max_runs_per_team=2)

    statuses = [post(functions, check("a", n, replymode="async")).status_code for n in range(2)]
    over = post(functions, check("a", 2, replymode="async"))
    other_team = post(functions, check("b", 0, replymode="async"))

    assert statuses == [202, 202]
    assert over.status_code == 429 and int(over.headers["Retry-After"]) > 0
    assert over.get_json()["error"]["kind"] == "too_many_runs"
    assert "'a'" in over.get_json()["error"]["message"]
    assert other_team.status_code == 202
    assert len(runtime.started) == 3  # a's two and b's one
    runtime.ends[0]()  # one of team a's tasks ends: a may start another
    assert post(functions, check("a", 3, replymode="async")).status_code == 202


def test_a_redelivery_of_a_started_run_is_not_counted_twice(store: Store) -> None:
    runtime = Ending(store)
    functions = make_client(store, "check", runtime, sink=SINK, max_runs_per_team=1)

    first = post(functions, check("a", 0, replymode="async"))
    again = post(functions, check("a", 0, replymode="async"))

    assert (first.status_code, again.status_code) == (202, 202)


def test_a_synchronous_run_over_the_teams_limit_is_429_before_it_runs(store: Store) -> None:
    release = threading.Event()

    entered: list[Task] = []

    class Blocking(FakeRuntime):
        def run(self, task: Task) -> Outcome:
            entered.append(task)
            if task.team == "a":  # team a's run lasts until released
                release.wait(30)
            return super().run(task)

    runtime = Blocking(store)
    functions = make_client(store, "check", runtime, max_runs_per_team=1)
    answers: list[Any] = []
    running = threading.Thread(target=lambda: answers.append(post(functions, check("a", 0))))
    running.start()
    try:
        wait_until(lambda: entered, "the first run")
        over = post(functions, check("a", 1))
        other_team = post(functions, check("b", 0))  # runs while team a waits
    finally:
        release.set()
        running.join()

    assert over.status_code == 429 and "Retry-After" in over.headers
    assert answers[0].status_code == 200 and other_team.status_code == 200
    assert [t.team for t in runtime.ran] == ["b", "a"]
    assert post(functions, check("a", 2)).status_code == 200  # the first has ended


def test_the_default_is_documented_and_positive() -> None:
    assert Settings(store_url="file:///x").max_runs_per_team >= 1
