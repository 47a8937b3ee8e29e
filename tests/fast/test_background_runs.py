"""Asynchronous runs are bounded, and closing waits for every one, queued ones included;
closing also waits for the synchronous runs under way, and refuses later work with a 503."""

from __future__ import annotations

import threading
import time

import pytest

from functions.errors import Unavailable
from functions.runtimes.background import BackgroundRuns, RunsInFlight


def test_at_most_limit_runs_at_once_and_close_waits_for_all() -> None:
    lock, running, most, done = threading.Lock(), [0], [0], []

    def run(i: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
            done.append(i)

    runs = BackgroundRuns("test", limit=2)
    for i in range(6):
        runs.submit(run, i)
    runs.close()

    assert sorted(done) == list(range(6))
    assert most[0] == 2


def test_a_run_that_raises_does_not_stop_the_others() -> None:
    done = []

    def run(i: int) -> None:
        if i == 0:
            raise RuntimeError("boom")
        done.append(i)

    runs = BackgroundRuns("test", limit=1)
    for i in range(3):
        runs.submit(run, i)
    runs.close()

    assert done == [1, 2]


def test_closed_runs_refuse_more_work_as_unavailable() -> None:
    runs = BackgroundRuns("test", limit=1)
    runs.close()
    with pytest.raises(Unavailable, match="stopping"):
        runs.submit(print, "never")


def test_close_waits_for_the_runs_in_flight_then_admits_none() -> None:
    in_flight, ended = RunsInFlight(), []
    entered = threading.Event()

    def run() -> None:
        with in_flight.admitted():
            entered.set()
            time.sleep(0.2)
            ended.append("run")

    thread = threading.Thread(target=run)
    thread.start()
    entered.wait(5)
    in_flight.close()
    ended.append("close")
    thread.join()

    assert ended == ["run", "close"]
    with pytest.raises(Unavailable, match="stopping"), in_flight.admitted():
        pass
