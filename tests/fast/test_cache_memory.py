"""Cache records kept in memory: a hot get is answered without the store, and an artifact
removed from the store (expired by a lifecycle rule) is still noticed, at most
CACHE_RECHECK_SECONDS after this replica last saw it."""

from __future__ import annotations

from typing import Any

import pytest

from functions.service.cache_memory import CacheMemory
from storage import Store
from tests.support.http_helpers import FakeRuntime, cache_entry, event, make_client, post, reply_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


RECORD = {"version": {"ref": "v1"}, "metadata": [], "artifact": {"url": "file:///x"}}


def test_an_entry_answers_only_within_the_recheck_window() -> None:
    clock = Clock()
    memory = CacheMemory(recheck_seconds=2, clock=clock)
    memory.seen("k", RECORD)
    clock.now += 1.9
    memory.fresh("k")  # the hit that looks again (see below)
    assert memory.fresh("k") == RECORD
    clock.now += 0.2
    assert memory.fresh("k") is None and memory.fresh("k") is None
    assert memory.record("k") == RECORD  # kept: records never change, only the artifact may go


def test_past_half_the_window_one_hit_looks_while_the_others_answer() -> None:
    clock = Clock()
    memory = CacheMemory(recheck_seconds=2, clock=clock)
    memory.seen("k", RECORD)
    clock.now += 0.9
    assert memory.fresh("k") == RECORD
    clock.now += 0.2
    assert memory.fresh("k") is None  # this hit looks in the store
    assert memory.fresh("k") == RECORD and memory.fresh("k") == RECORD
    memory.seen("k", RECORD)  # the look found the artifact: a new window
    clock.now += 0.9
    assert memory.fresh("k") == RECORD and memory.fresh("k") == RECORD


def test_a_look_that_did_not_end_leaves_the_entry_to_go_stale() -> None:
    clock = Clock()
    memory = CacheMemory(recheck_seconds=2, clock=clock)
    memory.seen("k", RECORD)
    clock.now += 1.5
    assert memory.fresh("k") is None  # looks, and fails (the store is unavailable)
    clock.now += 0.4
    assert memory.fresh("k") == RECORD
    clock.now += 0.1
    assert memory.fresh("k") is None and memory.fresh("k") is None  # every hit looks


def test_peek_answers_as_fresh_would_but_leaves_a_due_look_to_fresh() -> None:
    clock = Clock()
    memory = CacheMemory(recheck_seconds=2, clock=clock)
    assert memory.peek("k") is None
    memory.seen("k", RECORD)
    clock.now += 0.9
    assert memory.peek("k") == RECORD
    clock.now += 0.2
    assert memory.peek("k") is None and memory.peek("k") is None  # a look is due
    assert memory.fresh("k") is None  # still due: fresh's caller is the one to look
    assert memory.peek("k") == RECORD  # claimed: the others answer until the window ends
    clock.now += 0.9
    assert memory.peek("k") is None and memory.fresh("k") is None


def test_a_window_of_zero_never_answers_from_memory() -> None:
    memory = CacheMemory(recheck_seconds=0, clock=Clock())
    memory.seen("k", RECORD)
    assert memory.fresh("k") is None


def test_the_least_recently_used_entry_goes_first() -> None:
    memory = CacheMemory(recheck_seconds=10, capacity=2, clock=Clock())
    memory.seen("a", RECORD)
    memory.seen("b", RECORD)
    memory.fresh("a")
    memory.seen("c", RECORD)
    assert memory.record("a") and memory.record("c") and memory.record("b") is None


GET = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}


@pytest.fixture
def setup(store: Store) -> Any:
    runtime = FakeRuntime(store)
    client = make_client(store, "get", runtime, cache_recheck_seconds=5)
    clock = Clock()
    client.application.extensions["service"].answers.cache_memory = CacheMemory(5, clock=clock)
    post(client, event("get", GET, id="run"))  # a miss: runs, then the entry is stored
    key = cache_entry(store, runtime.ran[0].cache_key)
    return client, runtime, clock, key


def test_a_hot_entry_is_answered_from_memory(store: Store, setup: Any) -> None:
    client, runtime, clock, key = setup
    assert reply_of(post(client, event("get", GET, id="hit-1"))).get_data()["cached"] is True
    store.delete(key)  # within the first half of the window this replica does not look again
    clock.now += 2
    assert reply_of(post(client, event("get", GET, id="hit-2"))).get_data()["cached"] is True
    assert len(runtime.ran) == 1


def test_past_half_the_window_one_hit_looks_and_notices_a_removed_artifact(
    store: Store, setup: Any
) -> None:
    client, runtime, clock, key = setup
    assert reply_of(post(client, event("get", GET, id="hit-1"))).get_data()["cached"] is True
    store.delete(key)
    clock.now += 3
    again = reply_of(post(client, event("get", GET, id="looks")))
    assert again.get_data().get("cached") is not True and len(runtime.ran) == 2  # ran again


def test_an_artifact_removed_is_noticed_once_the_window_has_passed(
    store: Store, setup: Any
) -> None:
    client, runtime, clock, key = setup
    assert reply_of(post(client, event("get", GET, id="hit-1"))).get_data()["cached"] is True
    store.delete(key)  # as a bucket lifecycle rule would
    clock.now += 5
    again = reply_of(post(client, event("get", GET, id="after")))
    assert again.get_data().get("cached") is not True and len(runtime.ran) == 2  # ran again
    assert store.stat(f"artifacts/{runtime.ran[0].cache_key}.json") is None  # record removed
