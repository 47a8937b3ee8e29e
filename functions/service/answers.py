"""A call's answer: what answers it without a run of its own (the stored result of its run,
a redelivery; a get's cache entry; a check's history within its interval, or the history
after another replica's run of its resource); ``count``, the one place where an answer is
counted as a cache hit or a joined run; and the answer as events (``reply_of``, and first a
check's ``version.discovered`` events, ``post_discoveries``), built by ``functions.replies``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cloudevents.core.v1.event import CloudEvent

from functions.errors import SinkRefused, Unavailable
from functions.ledger import results
from functions.metrics import Metrics
from functions.model import Action, Outcome
from functions.replies import discovered_events, reply_event
from functions.service import checks
from functions.service.cache_memory import CacheMemory
from functions.service.call import Call
from functions.sink import post_events
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


def reply_of(action: Action, call: Call, outcome: Outcome) -> CloudEvent:
    return reply_event(action, outcome, call.reply_address)


def post_discoveries(sink: str, call: Call, outcome: Outcome) -> None:
    """A check's ``version.discovered`` events go to K_SINK (the HTTP response holds the
    reply alone). Without K_SINK they are not sent: the reply's ``new`` lists the same
    versions. A sink that refuses them is a 503: the redelivery replays the stored result
    and posts the same events (their ids derive from the resource and the version) again."""
    found = discovered_events(outcome, call.reply_address, call.plan)
    if not found or not sink:
        return
    try:
        post_events(sink, found)
    except SinkRefused as err:
        raise Unavailable(f"cannot post the version.discovered events: {err}") from err
