"""A work queue of keys, as Kubernetes controllers keep one (client-go's workqueue): each key
is queued at most once however often it is added, never handed to two workers at once (a key
added while a worker has it is handed out again after ``done``), can be added after a delay,
and retried with a per-key exponential backoff until ``forget``. Memory is bounded by the keys
that exist: a key leaves the queue when handed out, its backoff when forgotten.

    queue = WorkQueue()
    queue.add(key); queue.add_after(key, seconds); queue.retry(key)
    key = queue.get(timeout)   # None when closed, or nothing within timeout
    ...; queue.done(key); queue.forget(key)

``KeyLocks``: one lock per key, for whoever reconciles it or applies a reply to it.
``workers``: the threads that take the keys, for a block.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 300.0


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ready: deque[Hashable] = deque()  # in the order added
        self._queued: set[Hashable] = set()  # in _ready
        self._working: set[Hashable] = set()
        self._again: set[Hashable] = set()  # added while being worked on
        self._later: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}  # each later key's earliest time
        self._failures: dict[Hashable, int] = {}
        self._count = 0
        self._changed = threading.Condition()
        self._closed = False

    def add(self, key: Hashable) -> None:
        with self._changed:
            self._add(key)

    def add_after(self, key: Hashable, seconds: float) -> None:
        if seconds <= 0:
            self.add(key)
            return
        at = self._clock() + seconds
        with self._changed:
            if key in self._due and self._due[key] <= at:
                return  # due earlier already: a key is worked on once for both
            self._due[key] = at
            self._count += 1
            heapq.heappush(self._later, (at, self._count, key))
            self._changed.notify()

    def retry(self, key: Hashable) -> float:
        """Add ``key`` again after its backoff (doubling with each retry since ``forget``);
        the delay."""
        with self._changed:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(FIRST_BACKOFF * 2.0**failures, MAX_BACKOFF)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        with self._changed:
            self._failures.pop(key, None)

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next key to work on (the worker then owns it until ``done``)."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._changed:
            while True:
                self._promote()
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._working.add(key)
                    return key
                if self._closed:
                    return None
                now = self._clock()
                wait = min(
                    [t - now for t in ([deadline] if deadline is not None else [])]
                    + [self._later[0][0] - now if self._later else 1.0]
                )
                if deadline is not None and now >= deadline:
                    return None
                self._changed.wait(max(min(wait, 1.0), 0.01))

    def done(self, key: Hashable) -> None:
        with self._changed:
            self._working.discard(key)
            if key in self._again:
                self._again.discard(key)
                self._add(key)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def depth(self) -> int:
        """Keys waiting to be worked on now (not those added for later)."""
        with self._changed:
            return len(self._ready)

    def waiting(self) -> int:
        """Keys added for later."""
        with self._changed:
            return len(self._due)

    def _add(self, key: Hashable) -> None:
        if key in self._working:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._changed.notify()

    def _promote(self) -> None:
        now = self._clock()
        while self._later and self._later[0][0] <= now:
            at, _, key = heapq.heappop(self._later)
            if self._due.get(key) == at:  # else replaced by an earlier time, done already
                del self._due[key]
                self._add(key)


class KeyLocks:
    """One lock per key, held by whoever reconciles or applies a reply to it; kept only while
    in use."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    @contextmanager
    def held(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


@contextmanager
def workers(work: Callable[[], None], count: int, name: str, queue: WorkQueue) -> Iterator[None]:
    """``count`` threads running ``work`` (each takes keys from ``queue`` until it is closed)
    for the block; at its end the queue is closed and they are joined."""
    threads = [threading.Thread(target=work, name=f"{name}-{n}", daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        queue.close()
        for thread in threads:
            thread.join(30)
