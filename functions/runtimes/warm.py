"""Warm check containers: which one serves a check, and how long it lives (docs/warm-checks.md).

One warm container per key (``warm_check.warm_key``, a hash of the team, the image digest,
the resource key and the type's container settings): no secret and no team name shows in a
label or a name, and two teams or two sources never share one. A warm container runs one
check at a time: a check whose key's container is busy runs in a new container of its own,
as without reuse.

This module is the bookkeeping, engine-free: the runtime asks ``take`` for an idle warm
container, ``admit``s the one it started, gives it ``back`` after the check or ``evict``s it.
Expired ones (idle past ``idle_seconds``, older than ``max_age_seconds``) go at each
``expire`` (the runtime's reaper) or when ``take`` finds its own expired; the caps per replica and per team evict the least
recently used idle one. Removals go through ``remove`` (the runtime's, outside the lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from functions.errors import RunStopped, Unavailable
from functions.periodic import Periodic
from functions.phases import PhaseClock
from functions.runtimes.output import Output
from functions.settings import WarmLimits

# Why a warm container went (the ``reason`` label of resource_function_warm_evictions).
IDLE, AGE, REPLICA_CAP, TEAM_CAP, BUDGET, DEAD, DRAIN, STOPPED, QUOTA = (
    "idle",
    "age",
    "replica_cap",
    "team_cap",
    "budget",
    "dead",
    "drain",
    "stopped",  # its check's sender stopped the request (functions.service.stop_requests)
    "quota",  # the task namespace's quota had no room for another pod (warm_pods)
)
REASONS = (IDLE, AGE, REPLICA_CAP, TEAM_CAP, BUDGET, DEAD, DRAIN, STOPPED, QUOTA)


WARM_OFF = WarmLimits(enabled=False)  # a runtime configured by hand, as the tests do


@dataclass(frozen=True)
class WarmCounts:
    """What the metrics report (read at each scrape)."""

    alive: int = 0
    reuses: int = 0
    starts: int = 0
    evictions: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Warm:
    """One warm container, as the pool knows it. ``handle``: the engine's id of it."""

    key: str
    team: str
    handle: str
    started: float
    used: float
    busy: bool = True
    reused: bool = False  # ``take`` found it: it served a check before
    run: str = ""  # the run whose check it serves now
    stopped: bool = False  # evicted because that run was stopped

    def expired(self, limits: WarmLimits, now: float) -> str | None:
        if now - self.started >= limits.max_age_seconds:
            return AGE
        if not self.busy and now - self.used >= limits.idle_seconds:
            return IDLE
        return None


class Busy(Exception):
    """The key's warm container runs a check now: run this one without reuse."""


class Gone(Exception):
    """The warm container is not running (died, evicted, removed by hand)."""


class NotWarm(Exception):
    """No warm container could be started (no pause program, the engine refused to create or
    start it): the check runs without reuse, in a new container, whose own errors then say
    what is wrong (an image that cannot be had is a failure reply, an engine down a 503)."""


# A check's end in a warm container: its exit code (None: over its budget) and its output.
CheckEnd = tuple[int | None, Output]
log = logging.getLogger("functions.runtimes")


def check_in_warm(
    pool: WarmPool,
    key: str,
    clock: PhaseClock,
    start: Callable[[], Warm],
    execute: Callable[[str], CheckEnd],
    run: str = "",
) -> CheckEnd | None:
    """Run a check in ``key``'s warm container: the one ``pool`` has, else one ``start``
    starts (and admits); ``execute(handle)`` runs the check in it. None if it is busy or
    none could be started (``NotWarm``): run the check without reuse. Over its budget, the container is evicted (removed with every
    process in it). One found ``Gone`` is replaced, and the check runs once in the new one;
    a new one gone is ``Unavailable``. One evicted because ``run`` was stopped
    (``WarmPool.stop_run``) raises ``RunStopped``: the check is not run again."""
    for _ in range(2):
        try:
            warm = pool.take(key)
        except Busy:
            return None
        if warm is None:
            try:
                with clock.phase("create"):
                    warm = start()
            except NotWarm as err:
                log.warning("no warm check container, the check runs in a new one: %s", err)
                return None
        warm.run = run
        try:
            with clock.phase("script"):
                ended = execute(warm.handle)
        except Gone:
            if warm.stopped:
                raise RunStopped(f"run {run} was stopped by its sender during its check") from None
            pool.evict(warm, DEAD)
            if warm.reused:
                log.info("a warm check container was gone: replaced")
                continue
            raise Unavailable("a new warm check container died under its check") from None
        except BaseException:
            pool.evict(warm, DEAD)  # in a state unknown: not reused
            raise
        if warm.stopped:
            raise RunStopped(f"run {run} was stopped by its sender during its check")
        if ended[0] is None:
            pool.evict(warm, BUDGET)
        else:
            pool.back(warm)
        return ended
    raise Unavailable("warm check containers keep dying")  # pragma: no cover


class WarmPool:
    def __init__(
        self,
        limits: WarmLimits,
        remove: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._remove = remove
        self._clock = clock
        self._lock = threading.Lock()
        self._warm: OrderedDict[str, Warm] = OrderedDict()  # least recently used first
        self._starting: set[str] = set()  # keys whose container is being started
        self._closed = False  # drained: nothing is kept any more
        self._reuses = 0
        self._starts = 0
        self._evictions: Counter[str] = Counter()

    def take(self, key: str) -> Warm | None:
        """The key's idle warm container, now busy; None if it has none or it expired (the
        caller starts one and ``admit``s it). ``Busy`` if it runs a check or is starting."""
        gone: list[Warm] = []
        try:
            with self._lock:
                if key in self._starting:
                    raise Busy(key)
                warm = self._warm.get(key)
                if warm is not None and warm.busy:
                    raise Busy(key)
                if warm is not None and (reason := warm.expired(self.limits, self._clock())):
                    self._drop_locked(warm, reason, gone)
                    warm = None
                if warm is None:
                    self._starting.add(key)
                    return None
                warm.busy, warm.reused = True, True
                self._warm.move_to_end(key)
                self._reuses += 1
                return warm
        finally:
            self._remove_all(gone)

    def admit(self, key: str, team: str, handle: str) -> Warm | None:
        """Keep the container just started for ``key`` (busy with its first check), making
        room under the caps by evicting the least recently used idle ones. None if there is
        no room (every one that counts is busy): the caller removes it after its check."""
        gone: list[Warm] = []
        try:
            with self._lock:
                self._starting.discard(key)
                room = not self._closed and self._room_locked(team, gone)
                if not room:
                    return None
                now = self._clock()
                warm = Warm(key=key, team=team, handle=handle, started=now, used=now)
                self._warm[key] = warm
                self._starts += 1
                return warm
        finally:
            self._remove_all(gone)

    def not_started(self, key: str) -> None:
        """The container ``take`` let the caller start for ``key`` could not be started."""
        with self._lock:
            self._starting.discard(key)

    def back(self, warm: Warm) -> None:
        """The check is done: its container stays warm, unless the pool had no room for it
        (then it is removed now)."""
        with self._lock:
            kept = self._warm.get(warm.key) is warm
            warm.busy = False
            warm.used = self._clock()
        if not kept:
            self._remove_all([warm])

    def evict(self, warm: Warm, reason: str) -> None:
        """The check's container goes (over its budget, dead): removed now."""
        with self._lock:
            if self._warm.get(warm.key) is warm:
                del self._warm[warm.key]
                self._evictions[reason] += 1
        self._remove_all([warm])

    def stop_run(self, run: str) -> bool:
        """Evict the container whose check serves ``run`` (its sender stopped it), killing
        the check with it; whether one did."""
        with self._lock:
            found = next((w for w in self._warm.values() if w.busy and w.run == run), None)
            if found is None:
                return False
            found.stopped = True
        self.evict(found, STOPPED)
        return True

    def evict_idle(self, reason: str) -> bool:
        """Remove the least recently used idle one, of any team (the quota has no room for a
        new one); whether there was one."""
        gone: list[Warm] = []
        with self._lock:
            idle = next((w for w in self._warm.values() if not w.busy), None)
            if idle is not None:
                self._drop_locked(idle, reason, gone)
        self._remove_all(gone)
        return idle is not None

    def expire(self) -> int:
        """Remove the expired idle ones now; how many went."""
        with self._lock:
            gone = self._expired_locked()
        self._remove_all(gone)
        return len(gone)

    def drain(self) -> None:
        """Remove them all (the service stops); one started later serves its check only."""
        with self._lock:
            self._closed = True
            gone = list(self._warm.values())
            self._warm.clear()
            self._evictions[DRAIN] += len(gone)
        self._remove_all(gone)

    def counts(self) -> WarmCounts:
        with self._lock:
            return WarmCounts(
                alive=len(self._warm),
                reuses=self._reuses,
                starts=self._starts,
                evictions=dict(self._evictions),
            )

    def _expired_locked(self) -> list[Warm]:
        now = self._clock()
        gone: list[Warm] = []
        for warm in list(self._warm.values()):
            reason = warm.expired(self.limits, now)
            if reason and not warm.busy:  # a busy one past its age goes after its check
                self._drop_locked(warm, reason, gone)
        return gone

    def _drop_locked(self, warm: Warm, reason: str, gone: list[Warm]) -> None:
        del self._warm[warm.key]
        self._evictions[reason] += 1
        gone.append(warm)

    def _room_locked(self, team: str, gone: list[Warm]) -> bool:
        """Evict least recently used idle ones until one more fits both caps."""
        for reason, cap, counts in (
            (TEAM_CAP, self.limits.per_team, lambda w: w.team == team),
            (REPLICA_CAP, self.limits.per_replica, lambda w: True),
        ):
            members = [w for w in self._warm.values() if counts(w)]
            idle = [w for w in members if not w.busy]  # least recently used first
            while len(members) >= cap:
                if not idle:
                    return False
                victim = idle.pop(0)
                members.remove(victim)
                self._drop_locked(victim, reason, gone)
        return True

    def _remove_all(self, gone: list[Warm]) -> None:
        for warm in gone:
            self._remove(warm.handle)


REAP_SECONDS = 30.0  # how often expired warm containers are looked for (at most)


class WarmSet:
    """What a runtime's warm containers (``warm_engine``) or pods (``warm_pods``) share:
    swept at start, expired ones reaped now and then, all removed at close. A subclass
    says how to ``sweep`` and gives ``remove``."""

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
