"""Cache records kept in memory (bounded LRU), so a hot ``get`` is answered without the store.

A cache record is written once and never changes, so keeping it is safe. Its artifact,
though, may go (a bucket lifecycle rule expires it; an operator deletes it): an entry
answers only while its artifact was seen within ``recheck_seconds``; after that the next
hit looks in the store again (and finds the artifact gone, or sees it anew). So a replica
notices a removed artifact at most ``recheck_seconds`` after it last saw it; 0 means every
hit looks. The delay is of the same kind as the one between a hit and its requester's
download, which the artifact may not survive either.

The look is taken ahead of time: once half the window has passed, the next hit looks (as a
miss would) while the others still answer from memory until the window ends. So a hot entry
does not go stale, and the many hits arriving together do not all turn to the store when it
would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from functions.bounded_cache import BoundedCache

DEFAULT_CAPACITY = 4096  # records are a few hundred bytes: about a megabyte at most


class CacheMemory:
    def __init__(
        self,
        recheck_seconds: float,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recheck = recheck_seconds
        self._clock = clock
        self._lock = threading.Lock()  # a look is claimed by one hit only
        # key -> (record, when its artifact was seen, whether a hit has gone to look since)
        self._entries: BoundedCache[str, tuple[dict[str, Any], float, bool]] = BoundedCache(
            capacity
        )

    def fresh(self, key: str) -> dict[str, Any] | None:
        """The record, if its artifact was seen within ``recheck_seconds``; None also for the
        first hit past half the window, which is to look."""
        return self._answer(key, claim_look=True)

    def peek(self, key: str) -> dict[str, Any] | None:
        """The record ``fresh`` would answer without sending this caller to look: None too
        when a look is due and unclaimed (``fresh`` claims it)."""
        return self._answer(key, claim_look=False)

    def _answer(self, key: str, *, claim_look: bool) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.peek(key)
            if entry is None:
                return None
            record, seen, looking = entry
            age = self._clock() - seen
            if age >= self._recheck:
                return None
            if not looking and age >= self._recheck / 2:
                if claim_look:
                    self._entries.put(key, (record, seen, True))
                return None
            self._entries.get(key)  # now the most recently used
            return record

    def record(self, key: str) -> dict[str, Any] | None:
        """The record however long ago its artifact was seen (it needs a look again)."""
        entry = self._entries.peek(key)
        return entry[0] if entry is not None else None

    def seen(self, key: str, record: dict[str, Any]) -> None:
        """The record's artifact exists now."""
        with self._lock:
            self._entries.put(key, (record, self._clock(), False))

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key)
