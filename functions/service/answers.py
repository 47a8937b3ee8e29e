"""What answers a call without a run of its own: the stored result of its run (a
redelivery), a get's cache entry, or a check's history within its interval."""

from __future__ import annotations

from typing import Any

from functions.ledger import results
from functions.metrics import Metrics
from functions.model import Action, Outcome
from functions.service.cache_memory import CacheMemory
from functions.service.call import Call
from storage import Store


class Answers:
    def __init__(
        self, action: Action, store: Store, metrics: Metrics, cache_memory: CacheMemory
    ) -> None:
        self.action = action
        self.store = store
        self.metrics = metrics
        self.cache_memory = cache_memory

    def without_run(self, call: Call, fresh: Outcome | None) -> Outcome | None:
        """The answer that makes a run needless, if there is one."""
        return self.stored(call) or self.fresh(call, fresh)

    def stored(self, call: Call) -> Outcome | None:
        """The stored result of this run (redelivery), or a get's cache entry."""
        stored = results.read_outcome(self.store, call.run, request=call.request.digest)
        if stored is not None:
            self.metrics.joined.labels(self.action).inc()
            return stored
        if call.cache_key is None:
            return None
        cached = self.read_cache(call.cache_key)
        if cached is None:
            self.metrics.cache_misses.labels(self.action).inc()
            return None
        self.metrics.cache_hits.labels(self.action).inc()
        return Outcome(action=self.action, data=cached)

    def fresh(self, call: Call, fresh: Outcome | None) -> Outcome | None:
        """A check answered from the history (within its interval), recorded as this run's
        result so that a redelivery replays it, whatever the history says by then."""
        if fresh is None:
            return None
        self.metrics.cache_hits.labels(self.action).inc()
        return results.record_outcome(self.store, call.run, fresh, request=call.request.digest)

    def read_cache(self, key: str) -> dict[str, Any] | None:
        """The cache entry, its record from memory if kept, its artifact looked for."""
        cached = results.read_cache(self.store, key, self.cache_memory.record(key))
        if cached is None:
            self.cache_memory.forget(key)
        else:
            self.cache_memory.seen(key, cached)
        return cached
