"""The controller's work queue (functions/tekton/work_queue.py): a key once however often
added, never to two workers at once, later when asked, retried with a growing backoff."""

from __future__ import annotations

import threading

from functions.tekton.work_queue import FIRST_BACKOFF, MAX_BACKOFF, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_many_times_is_worked_on_once() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "a", "a", "b", "c"):
        queue.add(key)
    assert queue.depth() == 3
    assert [queue.get(0) for _ in range(3)] == ["a", "b", "c"]
    assert queue.get(0) is None


def test_a_key_added_while_worked_on_comes_again_after_done_and_not_before() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(0) == "a"
    queue.add("a")  # an event for it while a worker has it
    assert queue.get(0) is None, "never to a second worker at once"
    queue.done("a")
    assert queue.get(0) == "a"
    queue.done("a")
    assert queue.get(0) is None


def test_keys_added_for_later_come_at_their_time_each_at_its_earliest() -> None:
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add_after("late", 10)
    queue.add_after("soon", 2)
    queue.add_after("soon", 5)  # later than it is due already: no second entry
    queue.add_after("late", 4)  # earlier: replaces
    assert queue.waiting() == 2
    assert queue.get(0) is None
    clock.now = 4
    assert [queue.get(0), queue.get(0), queue.get(0)] == ["soon", "late", None]
    clock.now = 20
    assert queue.get(0) is None, "the replaced time does not bring it again"
    assert queue.waiting() == 0


def test_retries_back_off_doubling_to_a_cap_until_forgotten() -> None:
    clock = Clock()
    queue = WorkQueue(clock)
    delays = [queue.retry("a") for _ in range(12)]
    assert delays[:3] == [FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4]
    assert delays[-1] == MAX_BACKOFF
    queue.forget("a")
    assert queue.retry("a") == FIRST_BACKOFF


def test_get_waits_for_a_key_and_close_wakes_it() -> None:
    queue = WorkQueue()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(queue.get(10)))
    worker.start()
    queue.add("a")
    worker.join(5)
    assert got == ["a"]
    worker = threading.Thread(target=lambda: got.append(queue.get(10)))
    worker.start()
    queue.close()
    worker.join(5)
    assert got == ["a", None] and not worker.is_alive()
