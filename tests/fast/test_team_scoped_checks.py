"""Checks are scoped per team, as Concourse scopes a resource to its pipeline: two teams'
checks of the same image and source have their own lease, history and ``version.discovered``
events; and a check that waited for another run never takes that run's failure (its log tail,
its credentials' error) as its answer: it runs its own check.

The HTTP layer and the Service in-process: a runtime whose "script" lists the commits of an
in-memory repository (``testbed.repository_runtime``) and the file store."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from functions import keys
from functions.ledger import lease, results
from functions.model import Failure, Outcome, Task
from functions.service import shared_check
from functions.service.flights import Flights
from storage import Store, open_store
from testbed.repository_runtime import RepositoryRuntime
from tests.support.check_replicas import send
from tests.support.http_helpers import GIT_IMAGE
from tests.support.http_helpers import check_client as client

SECRET = b"k" * 32
SOURCE = {"uri": "https://example.org/repo.git"}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "store").mkdir()
    return open_store((tmp_path / "store").as_uri())


def check(functions: Any, event_id: str, team: str, **data: Any) -> tuple[int, dict[str, Any]]:
    request = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.resourcefunctions.check.requested",
            "source": "/ci/" + team,
            "id": event_id,
            "datacontenttype": "application/json",
        },
        data={"type": "git", "source": SOURCE, "build": {"team": team}, **data},
    )
    return send(functions, request)


def test_two_teams_checking_one_source_have_their_own_history_and_discoveries(
    store: Store,
) -> None:
    runtime = RepositoryRuntime(store)
    functions = client(store, runtime)

    status_a, a = check(functions, "a-1", "team-a", version="latest-known")
    status_b, b = check(functions, "b-1", "team-b", version="latest-known")

    assert (status_a, status_b) == (200, 200)
    # Team B's first check is a first check: A's history does not continue it, and the
    # versions it found are new to team B (announced to B, not taken as A's).
    assert runtime.stdins[1]["version"] is None
    assert a["new"] == b["new"] == [{"ref": "1"}]


def test_the_keys_of_a_resource_differ_per_team_and_not_within_one() -> None:
    def key(team: str) -> str:
        return keys.resource_key(SECRET, image=GIT_IMAGE, source=SOURCE, team=team)

    assert len({key("team-a"), key("team-b"), key("")}) == 3
    assert key("team-a") == key("team-a")


class SignallingStore:
    """The store, and an event set once the waiter has read the lease held by another run:
    the holder's run may end only then (so the waiter is sure to be waiting for it)."""

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key
        self.waiting = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def read_record(self, key: str) -> Any:
        record = self.store.read_record(key)
        if key == self.key and record is not None and not lease.parse(record.data).released:
            self.waiting.set()
        return record


def test_a_waiter_runs_its_own_check_when_the_run_it_waited_for_failed(store: Store) -> None:
    key = keys.lease_record_key("r" * 64)
    held = lease.take(store, key, None, run="holder-run", ttl=30, now=1e12 - 60)
    assert held is not None
    watched = SignallingStore(store, key)
    failure = Outcome(
        action="check", failure=Failure("script", "bad credentials", log_tail="holder's log")
    )

    def holder_ends_failing() -> None:
        watched.waiting.wait(30)
        results.record_outcome(store, "holder-run", failure, request="holder-digest")
        lease.release(store, key, held)

    ended = threading.Thread(target=holder_ends_failing)
    ended.start()
    try:
        outcome, run = shared_check.run_or_wait(
            watched,  # type: ignore[arg-type]
            key,
            run="waiter-run",
            ttl=30,
            timeout=30,
            work=lambda: Outcome(action="check", data={"versions": [{"ref": "1"}]}),
        )
    finally:
        ended.join()

    assert (run, outcome.succeeded) == ("waiter-run", True)


def test_a_check_that_joined_a_failing_run_in_process_runs_its_own(store: Store) -> None:
    class Scripted(RepositoryRuntime):
        """Fails its first run (once the second request has joined it), then lists commits."""

        def __init__(self, store: Store, joined: threading.Event) -> None:
            super().__init__(store)
            self.joined, self.runs = joined, 0
            self.started = threading.Event()  # the first request's run is under way

        def run(self, task: Task) -> Outcome:
            self.runs += 1
            if self.runs > 1:
                return super().run(task)
            self.started.set()
            self.joined.wait(30)
            failed = Outcome(action="check", failure=Failure("script", "first run failed"))
            return results.record_outcome(
                self.store, task.run_id, failed, request=task.request_digest
            )

    class Watched(Flights):
        def __init__(self, joined: threading.Event) -> None:
            super().__init__()
            self.joined = joined

        def run(self, keys: list[str], work: Any) -> Any:
            with self._lock:
                if any(k in self._running for k in keys):
                    self.joined.set()
            return super().run(keys, work)

    joined = threading.Event()
    runtime = Scripted(store, joined)
    functions = client(store, runtime)
    functions.application.extensions["service"].sync_path.flights = Watched(joined)
    answers: dict[str, Any] = {}
    first = threading.Thread(
        target=lambda: answers.update(first=check(functions, "a-1", "team-a", version=None))
    )
    first.start()
    try:
        assert runtime.started.wait(30)  # the second request joins the first's run
        answers["second"] = check(functions, "a-2", "team-a", version=None)
    finally:
        joined.set()
        first.join()

    assert answers["first"][0] == 200 and "error" in answers["first"][1]
    assert answers["second"] == (200, {"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})
    assert runtime.runs == 2
