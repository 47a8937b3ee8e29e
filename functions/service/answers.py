"""What answers a call without a run of its own: the stored result of its run (a
redelivery), a get's cache entry, a check's history within its interval, or the history
after another replica's run of its resource; and ``count``, the one place where an answer
is counted as a cache hit or a joined run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from functions.ledger import results
from functions.metrics import Metrics
from functions.model import Action, Outcome
from functions.service import checks
from functions.service.cache_memory import CacheMemory
from functions.service.call import Call
from storage import Store

# How an answer came: the call's own run; a get's cache entry or a check's history (a
# cache hit); another run (a stored result, an identical request's run, the lease holder's).
How = Literal["run", "cache", "joined"]


@dataclass(frozen=True)
class Answer:
    """A call's outcome and how it came. ``announce``: a check's discovered versions are
    posted with its reply (not by a request that joined an identical request's run in this
    process: that request announces them)."""

    outcome: Outcome
    how: How
    announce: bool = True


class Answers:
    def __init__(
        self, action: Action, store: Store, metrics: Metrics, cache_memory: CacheMemory
    ) -> None:
        self.action = action
        self.store = store
        self.metrics = metrics
        self.cache_memory = cache_memory

    def count(self, how: How) -> None:
        """Count an answer that came without a run of its own: a cache hit or a joined run."""
        if how == "cache":
            self.metrics.cache_hits.labels(self.action).inc()
        elif how == "joined":
            self.metrics.joined.labels(self.action).inc()

    def without_run(self, call: Call, fresh: Outcome | None) -> Answer | None:
        """The answer that makes a run needless, if there is one."""
        return self.stored(call) or self.fresh(call, fresh)

    def stored(self, call: Call) -> Answer | None:
        """The stored result of this run (redelivery), or a get's cache entry."""
        stored = results.read_outcome(self.store, call.run, request=call.request.digest)
        if stored is not None:
            return Answer(stored, "joined")
        if call.cache_key is None:
            return None
        cached = self.read_cache(call.cache_key)
        if cached is None:
            self.metrics.cache_misses.labels(self.action).inc()
            return None
        return Answer(Outcome(action=self.action, data=cached), "cache")

    def fresh(self, call: Call, fresh: Outcome | None) -> Answer | None:
        """A check answered from the history (within its interval), recorded as this run's
        result so that a redelivery replays it, whatever the history says by then."""
        if fresh is None:
            return None
        recorded = results.record_outcome(self.store, call.run, fresh, request=call.request.digest)
        return Answer(recorded, "cache")

    def joined(self, call: Call) -> Answer:
        """A check's answer from another run of its resource that succeeded (the history),
        stored under its own run id so that its redelivery replays it."""
        assert call.plan is not None
        answer = checks.joined_answer(self.store, call.request, call.plan)
        recorded = results.record_outcome(self.store, call.run, answer, request=call.request.digest)
        return Answer(recorded, "joined")

    def read_cache(self, key: str) -> dict[str, Any] | None:
        """The cache entry, its record from memory if kept, its artifact looked for."""
        cached = results.read_cache(self.store, key, self.cache_memory.record(key))
        if cached is None:
            self.cache_memory.forget(key)
        else:
            self.cache_memory.seen(key, cached)
        return cached
