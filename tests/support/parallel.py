"""Run a call from several threads released at the same instant (for redelivery tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def parallel(call: Callable[[int], Any], n: int, timeout: float = 180) -> list[Any]:
    """``[call(0), …, call(n-1)]``, each in its own thread, all started behind one barrier."""
    results: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results
