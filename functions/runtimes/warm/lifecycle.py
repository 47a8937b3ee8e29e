"""What a runtime's warm containers (``engine``) or pods (``pods``) share: the pool, swept at
start, expired ones reaped now and then, all removed at close."""

from __future__ import annotations

from collections.abc import Callable

from functions.periodic import Periodic
from functions.runtimes.warm.pool import WarmCounts, WarmPool
from functions.settings import WarmLimits

REAP_SECONDS = 30.0  # how often expired warm containers are looked for (at most)


class WarmSet:
    """A subclass says how to ``sweep`` (the leftovers of owners gone) and gives ``remove``."""

    def __init__(self, limits: WarmLimits, remove: Callable[[str], None]) -> None:
        self.pool = WarmPool(limits, remove)
        period = min(REAP_SECONDS, limits.idle_seconds / 2)
        self._reaper = Periodic("warm-reap", period, self.pool.expire)

    def sweep(self) -> int:
        raise NotImplementedError

    def start(self) -> None:
        """Sweep the leftovers of owners gone, then reap expired ones now and then."""
        self.sweep()
        self._reaper.start()

    def close(self) -> None:
        """Remove them all (the runs using them have ended)."""
        self._reaper.stop()
        self.pool.drain()

    def counts(self) -> WarmCounts:
        return self.pool.counts()

    def stop(self, run: str) -> None:
        """End the check under way for ``run`` here, if any (``WarmPool.stop_run``)."""
        self.pool.stop_run(run)
