"""functions/periodic.py: a job every so often on a thread of its own, a failure logged and
run again, ``False`` ending the loop, ``stop`` waiting for the round under way."""

from __future__ import annotations

import threading
import time

import pytest

from functions.periodic import Periodic


def wait_for(condition, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_first_now_runs_at_once_then_every_period_until_stopped() -> None:
    runs: list[float] = []
    periodic = Periodic("t", 0.05, lambda: runs.append(time.monotonic()), first_now=True)
    periodic.start()
    wait_for(lambda: len(runs) >= 3)
    periodic.stop()
    count = len(runs)
    time.sleep(0.15)
    assert len(runs) == count


def test_without_first_now_the_first_run_waits_a_period() -> None:
    runs: list[int] = []
    periodic = Periodic("t", 0.5, lambda: runs.append(1)).start()
    time.sleep(0.2)
    assert runs == []
    periodic.stop()
    assert runs == []


def test_a_failing_job_is_logged_and_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    def job() -> None:
        runs.append(1)
        raise RuntimeError("a bug")

    periodic = Periodic("flaky", 0.02, job, first_now=True).start()
    wait_for(lambda: len(runs) >= 2)
    periodic.stop()
    assert "flaky failed" in caplog.text


def test_false_ends_the_loop_but_zero_does_not() -> None:
    results = iter([0, None, False, True])
    runs: list[int] = []

    def job() -> object:
        runs.append(1)
        return next(results)

    periodic = Periodic("t", 0.01, job, first_now=True).start()
    wait_for(lambda: len(runs) == 3)
    time.sleep(0.1)
    assert len(runs) == 3
    periodic.stop()


def test_an_owners_event_stops_it_and_stop_waits_for_the_round_under_way() -> None:
    owner = threading.Event()
    inside, release = threading.Event(), threading.Event()
    done: list[int] = []

    def job() -> None:
        inside.set()
        release.wait(5)
        done.append(1)

    periodic = Periodic("t", 10, job, first_now=True, stopped=owner).start()
    assert inside.wait(5)
    stopper = threading.Thread(target=periodic.stop)
    stopper.start()
    time.sleep(0.1)
    assert owner.is_set() and stopper.is_alive()  # waits for the round
    release.set()
    stopper.join(5)
    assert done == [1] and not stopper.is_alive()
