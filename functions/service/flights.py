"""Single flight: callers that name the same key while a run is under way share its result.

In-process only. Across replicas, redelivery is made idempotent by the stored result
records and (on Kubernetes) by Job names derived from the request identity.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class Flights:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, Future[Any]] = {}

    def run(self, keys: Sequence[str], work: Callable[[], T]) -> tuple[T, bool]:
        """Run ``work`` unless a run under any of ``keys`` is in flight; then wait for that.
        Returns (result, joined) where joined says the result came from another caller."""
        with self._lock:
            for key in keys:
                # A run that has ended is not joined (its key goes once its result is set).
                if key in self._running and not self._running[key].done():
                    future = self._running[key]
                    break
            else:
                future = None
                mine: Future[Any] = Future()
                for key in keys:
                    self._running[key] = mine
        if future is not None:
            return future.result(), True
        try:
            result = work()
        except BaseException as err:
            mine.set_exception(err)
            raise
        else:
            mine.set_result(result)
            return result, False
        finally:
            with self._lock:
                for key in keys:
                    if self._running.get(key) is mine:
                        del self._running[key]

    def in_flight(self) -> int:
        with self._lock:
            return len({id(f) for f in self._running.values()})
