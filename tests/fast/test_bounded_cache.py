"""functions/bounded_cache.py: at most ``capacity`` entries, the least recently used dropped
first; ``peek`` leaves the order, ``get`` and ``put`` refresh it."""

from __future__ import annotations

import threading

import pytest

from functions.bounded_cache import BoundedCache


def test_the_least_recently_used_goes_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recently used
    cache.put("c", 3)
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    assert cache.peek("a") == 1
    cache.put("d", 4)  # peek did not refresh a; c was used after it
    assert cache.values() == [3, 4] and len(cache) == 2


def test_pop_and_absent_keys() -> None:
    cache: BoundedCache[str, int] = BoundedCache(1)
    assert cache.get("x") is None and cache.peek("x") is None
    cache.put("x", 0)
    assert cache.get("x") == 0  # a falsy value is still found
    cache.pop("x")
    cache.pop("x")
    assert len(cache) == 0


def test_it_refuses_no_room() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BoundedCache(0)


def test_threads_never_take_it_past_its_capacity() -> None:
    cache: BoundedCache[int, int] = BoundedCache(8)

    def fill(start: int) -> None:
        for n in range(start, start + 500):
            cache.put(n, n)
            cache.get(n - 3)

    threads = [threading.Thread(target=fill, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 8
