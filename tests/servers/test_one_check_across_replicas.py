"""One check per resource across replicas, on every backend (file, s3 on versitygw, gcs on
fake-gcs-server): separate Service objects (each with its own in-process single flight, as
separate replicas have) on one store, identical checks sent to all at once: one run, every
reply the same versions; the waiters' answers survive redelivery; a holder that died or gave
up hands the check to exactly one waiter (``functions.service.shared_check``)."""

from __future__ import annotations

import threading
import time
from typing import Any

from functions.errors import Unavailable
from functions.ledger import lease, results
from functions.model import Outcome
from functions.service import shared_check
from storage import Store, StoreOptions, open_store
from testbed.repository_runtime import RepositoryRuntime
from tests.support.check_replicas import check, replicas
from tests.support.parallel import parallel

KEY = "leases/resource.json"


def test_identical_checks_on_several_replicas_start_one_run(store_url: str) -> None:
    runtime = RepositoryRuntime(open_store(store_url, StoreOptions()), seconds=0.5)
    runtime.commits += ["2", "3"]
    services = replicas(store_url, runtime, 5)

    replies = parallel(
        lambda i: check(services[i], f"tick-{i}", version="latest-known"), len(services)
    )

    assert len(runtime.stdins) == 1
    assert {status for status, _ in replies} == {200}
    assert [data["versions"] for _, data in replies] == [[{"ref": "3"}]] * 5
    assert sorted(len(data["new"]) for _, data in replies) == [0, 0, 0, 0, 1]  # announced once


def test_a_waiters_redelivery_replays_its_answer_and_a_later_check_runs_again(
    store_url: str,
) -> None:
    runtime = RepositoryRuntime(open_store(store_url, StoreOptions()), seconds=0.5)
    services = replicas(store_url, runtime, 3)
    first = parallel(lambda i: check(services[i], f"tick-{i}"), len(services))
    runtime.commits += ["2"]

    again = [check(services[(i + 1) % 3], f"tick-{i}") for i in range(3)]  # other replicas
    later = check(services[0], "tick-later")

    assert again == first and len(runtime.stdins) == 2
    assert later == (200, {"versions": [{"ref": "2"}], "new": [{"ref": "2"}]})


def recorded(store: Store, calls: list[str], lock: threading.Lock, run: str) -> Outcome:
    """The work of a check: counted, slow enough to overlap, its result stored under ``run``."""
    with lock:
        calls.append(run)
    time.sleep(0.3)
    outcome = Outcome(action="check", data={"versions": [run]})
    return results.record_outcome(store, run, outcome, request="")


def wait_together(store: Store, n: int, **options: Any) -> tuple[list[Any], list[str]]:
    calls: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> Any:
        run = f"run-{i}"
        try:
            return shared_check.run_or_wait(
                store, KEY, run=run, work=lambda: recorded(store, calls, lock, run), **options
            )
        except Unavailable as err:
            return err

    return parallel(one, n), calls


def test_waiters_of_a_holder_that_died_hand_the_check_to_exactly_one(store: Store) -> None:
    dead = lease.take(store, KEY, None, run="dead", ttl=1, now=time.time())
    assert dead is not None  # never released, no result: its replica died

    results, calls = wait_together(store, 4, ttl=30, timeout=60)

    assert len(calls) == 1
    assert results == [(Outcome(action="check", data={"versions": [calls[0]]}), calls[0])] * 4


def asleep_through(store: Store, monkeypatch: Any, other: str) -> tuple[Any, Any, list[str]]:
    """The holder died. Waiter A sleeps between two reads of the lease while waiter ``other``
    takes the expired lease, runs the check and releases. A's reply, the other's, and the
    check runs in order."""
    assert lease.take(store, KEY, None, run="dead", ttl=1, now=time.time()) is not None
    calls: list[str] = []
    lock, asleep, other_done = threading.Lock(), threading.Event(), threading.Event()
    real_sleep = time.sleep

    class Clock:  # A's first pause lasts until the other's run is over
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            if threading.current_thread().name == "waiter-A" and not asleep.is_set():
                asleep.set()
                other_done.wait(30)
            else:
                real_sleep(seconds)

    monkeypatch.setattr(shared_check, "time", Clock())

    def waiter(run: str) -> Any:
        work = lambda: recorded(store, calls, lock, run)
        return shared_check.run_or_wait(store, KEY, run=run, ttl=30, timeout=60, work=work)

    a_replied: list[Any] = []
    a = threading.Thread(target=lambda: a_replied.append(waiter("A")), name="waiter-A")
    a.start()
    try:
        assert asleep.wait(10), "A did not find the dead holder's lease"
        other_replied = waiter(other)  # waits for the lease to expire, then runs
    finally:
        other_done.set()
        a.join(30)
    return a_replied, other_replied, calls


def test_a_waiter_asleep_through_another_waiters_whole_run_takes_its_result(
    store: Store, monkeypatch: Any
) -> None:
    # Before, A read only the dead holder's result, found none, and ran the check again.
    a_replied, b_replied, calls = asleep_through(store, monkeypatch, "B")

    assert calls == ["B"]
    assert a_replied == [b_replied] == [(Outcome(action="check", data={"versions": ["B"]}), "B")]


def test_a_waiter_never_takes_a_result_recorded_before_it_came(
    store: Store, monkeypatch: Any
) -> None:
    # Run R's first delivery recorded its result; R's redelivery takes the lease over while
    # A sleeps, finds that result stored (its work runs no script) and releases. It is
    # older than A's request: A runs the check.
    old = Outcome(action="check", data={"versions": ["from before A came"]})
    results.record_outcome(store, "R", old, request="")
    time.sleep(0.01)  # finished_at has milliseconds

    a_replied, r_replied, calls = asleep_through(store, monkeypatch, "R")

    assert r_replied == (old, "R") and calls == ["R", "A"]
    assert a_replied == [(Outcome(action="check", data={"versions": ["A"]}), "A")]


def test_waiters_of_a_holder_that_gave_up_without_a_result_run_the_check_once(
    store: Store,
) -> None:
    held = lease.take(store, KEY, None, run="gave-up", ttl=3600, now=time.time())
    assert held is not None
    waiting = threading.Thread(
        target=lambda: results.extend(wait_together(store, 3, ttl=30, timeout=60))
    )
    results: list[Any] = []
    waiting.start()
    time.sleep(0.3)  # let them find the lease held (the outcome does not depend on it)
    lease.release(store, KEY, held)  # e.g. its engine was unreachable: released, no result
    waiting.join(120)

    replies, calls = results
    assert len(calls) == 1 and {holder for _, holder in replies} == {calls[0]}


def test_a_waiter_gives_up_with_unavailable_when_the_holder_outlasts_its_timeout(
    store: Store,
) -> None:
    held = lease.take(store, KEY, None, run="slow", ttl=3600, now=time.time())
    assert held is not None

    results, calls = wait_together(store, 2, ttl=30, timeout=0.5)

    assert calls == [] and all(isinstance(r, Unavailable) for r in results)
