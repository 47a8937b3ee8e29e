"""Runs in flight per team on this replica (``MAX_RUNS_PER_TEAM``), so that one team's burst
cannot take every thread, container or Job of the replica from the others.

A run is counted from before its container or Job is created until it ends: a synchronous run
until ``run`` returns, an asynchronous one until its runtime reports its end (``ended``). It is
counted by run id, so a redelivery of a started run (started again idempotently) is not
counted twice. Over the limit, ``TooManyRuns`` is answered 429 with ``Retry-After`` before
anything starts; the Broker retries it. Requests naming no team are one team (``""``).
A runtime that never reports an end (closed, or a Kubernetes task it stopped following at
shutdown) leaves its count until the replica ends, which is then.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from functions.errors import TooManyRuns

RETRY_AFTER_SECONDS = 10  # a check or get ends within seconds; the Broker's backoff adds more


class TeamRuns:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._runs: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def take(self, team: str, run: str) -> None:
        """Count ``run`` for ``team``; ``TooManyRuns`` if the team is at its limit."""
        with self._lock:
            runs = self._runs.setdefault(team, set())
            if run not in runs and len(runs) >= self.limit:
                raise TooManyRuns(
                    f"team {team!r} has {len(runs)} runs in flight on this replica, its limit "
                    f"(MAX_RUNS_PER_TEAM); retry later",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            runs.add(run)

    def done(self, team: str, run: str) -> None:
        with self._lock:
            runs = self._runs.get(team, set())
            runs.discard(run)
            if not runs:
                self._runs.pop(team, None)

    @contextmanager
    def held(self, team: str, run: str) -> Iterator[None]:
        self.take(team, run)
        try:
            yield
        finally:
            self.done(team, run)
