"""Callers naming the same key share one run; different keys run apart."""

import threading
import time

import pytest

from functions.service.flights import Flights


def test_concurrent_callers_share_one_run():
    flights, calls, results = Flights(), [], []
    gate = threading.Event()

    def work():
        calls.append(1)
        gate.wait(5)
        return "done"

    def call(i):
        results.append(flights.run(["k", f"x{i}"], work))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert len(calls) == 1
    assert sorted(joined for _, joined in results) == [False, True, True, True, True]
    assert flights.in_flight() == 0


def test_errors_reach_every_waiter_and_clear_the_flight():
    flights = Flights()
    with pytest.raises(RuntimeError):
        flights.run(["k"], lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert flights.run(["k"], lambda: 1) == (1, False)
