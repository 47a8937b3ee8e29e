"""Which warm container (a pod on Kubernetes) serves a check, and how long it lives: the
bookkeeping, engine-free (docs/warm-checks.md).

A warm container serves one pool key (``check.pool_key``: the team, the image digest and the
type's container settings) and many sources of it, each in a directory of its own
(``check.source_dir``), at most ``checks_at_once`` checks at once and one check at a time per
source. A source goes back to the container that holds its directory while that one has
room; else to the key's container with the fewest sources; with none free, a new one starts
(one start at a time per key: the checks that find none free meanwhile wait for it), as the
caps per replica and per team allow, evicting the least recently used idle ones. A check
that finds no room within its wait runs without reuse.

The runtime asks ``take`` for a ``Slot`` (a container and a source), starts one and
``admit``s it when ``take`` says so, gives the slot ``back`` after the check, or ``evict``s
the container (dead). Idle ones past ``idle_seconds``, and ones older than
``max_age_seconds`` once idle, go at each ``expire`` (the runtime's reaper); a source unused
for ``idle_seconds`` is forgotten (the agent removes its directory). Removals go through
``remove`` (the runtime's, outside the lock).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from functions.errors import RunStopped
from functions.settings import WarmLimits

# Why a warm container went (the ``reason`` label of resource_function_warm_evictions). A
# check over its budget, or whose sender stopped it, ends alone: its container stays.
IDLE, AGE, REPLICA_CAP, TEAM_CAP, DEAD, DRAIN, QUOTA = (
    "idle",
    "age",
    "replica_cap",
    "team_cap",
    "dead",
    "drain",
    "quota",  # the task namespace's quota had no room for another pod (warm pods)
)
REASONS = (IDLE, AGE, REPLICA_CAP, TEAM_CAP, DEAD, DRAIN, QUOTA)
WARM_OFF = WarmLimits(enabled=False)  # a runtime configured by hand, as the tests do


@dataclass(frozen=True)
class WarmCounts:
    """What the metrics report (read at each scrape)."""

    alive: int = 0
    reuses: int = 0
    starts: int = 0
    evictions: Mapping[str, int] = field(default_factory=dict)
    sources: int = 0  # sources whose directory a warm container keeps


@dataclass(eq=False)
class Warm:
    """One warm container of ``key``. ``handle``: the runtime's name of it; ``address``:
    where its agent listens (Kubernetes), else ""."""

    key: str
    team: str
    handle: str
    started: float
    used: float
    address: str = ""
    checks: dict[str, Slot] = field(default_factory=dict)  # source -> its check under way
    sources: dict[str, float] = field(default_factory=dict)  # source -> last used
    served: int = 0  # checks run here
    removed: bool = False  # handed to ``remove`` (once)

    def expired(self, limits: WarmLimits, now: float) -> str | None:
        if now - self.started >= limits.max_age_seconds:
            return AGE
        if not self.checks and now - self.used >= limits.idle_seconds:
            return IDLE
        return None


@dataclass(eq=False)
class Slot:
    """One check's place: ``warm`` (None while the caller starts one for ``key``), its
    ``source``, and the ``run`` it serves. ``cancel``: set by the runtime while the check
    runs, to end it alone (a sender's stop)."""

    key: str
    team: str
    source: str
    run: str = ""
    warm: Warm | None = None
    reused: bool = False  # the container served a check before
    stopped: bool = False  # its sender stopped the request meanwhile
    cancel: Callable[[], None] | None = None


class Busy(Exception):
    """The source's previous check still runs: run this one without reuse."""


class NoRoom(Exception):
    """No warm container had room within the wait: run the check without reuse."""


class Gone(Exception):
    """The warm container is not running (died, evicted, removed by hand)."""


class NotWarm(Exception):
    """No warm container could be started (no agent or pause program, the engine refused
    to create or start it): the check runs without reuse, in a new container, whose own
    errors then say what is wrong (an image that cannot be had is a failure reply, an engine
    down a 503)."""


class WarmPool:
    def __init__(
        self,
        limits: WarmLimits,
        remove: Callable[[str], None],  # a removed container's handle
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._remove = remove
        self._clock = clock
        self._changed = threading.Condition()
        self._warm: list[Warm] = []  # least recently used first
        self._starting: dict[str, str] = {}  # key whose next container starts -> its team
        self._pending: list[Slot] = []  # slots waiting for room or for their container
        self._closed = False  # drained: nothing is kept any more
        self._reuses = 0
        self._starts = 0
        self._evictions: Counter[str] = Counter()

    # --- a check's way in and out -------------------------------------------------------

    def take(self, key: str, team: str, source: str, run: str = "", wait: float = 0.0) -> Slot:
        """A slot for ``source``'s check in one of ``key``'s warm containers. Its ``warm`` is
        None when the caller is to start one (and ``admit`` it, or ``not_started``).
        ``Busy`` if the source's previous check still runs; ``NoRoom`` if none had room
        within ``wait`` seconds; ``RunStopped`` if its sender stopped it meanwhile."""
        deadline = time.monotonic() + wait  # real time, whatever clock ages the containers
        gone: list[Warm] = []
        slot = Slot(key, team, source, run)
        starting = False
        try:
            with self._changed:
                self._pending.append(slot)  # a stop finds it while it waits or starts
                try:
                    while True:
                        if slot.stopped:
                            raise RunStopped(f"run {run} was stopped by its sender")
                        if self._source_busy(key, source):
                            raise Busy(source)
                        warm = self._room_for(key, source, gone)
                        if warm is not None:
                            self._occupy(warm, slot, reused=warm.served > 0)
                            return slot
                        if key not in self._starting and self._can_start(team, gone):
                            self._starting[key] = team
                            starting = True
                            return slot
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise NoRoom(f"no warm container had room within {wait:g} s")
                        self._changed.wait(min(left, 1.0))
                finally:
                    if not starting:
                        self._pending.remove(slot)
        finally:
            self._remove_all(gone)

    def admit(self, slot: Slot, handle: str, address: str = "") -> Warm:
        """Keep the container just started for ``slot`` (which it now serves). One the pool
        has no room for (drained meanwhile) serves this check only: ``back`` removes it."""
        with self._changed:
            self._starting.pop(slot.key, None)
            self._pending.remove(slot)
            now = self._clock()
            warm = Warm(slot.key, slot.team, handle, now, now, address)
            if not self._closed:
                self._warm.append(warm)
                self._starts += 1
            self._occupy(warm, slot, reused=False)
            self._changed.notify_all()
            return warm

    def not_started(self, slot: Slot) -> None:
        """The container ``take`` let the caller start for ``slot`` could not be started."""
        with self._changed:
            self._starting.pop(slot.key, None)
            if slot in self._pending:
                self._pending.remove(slot)
            self._changed.notify_all()

    def back(self, slot: Slot) -> None:
        """The check is done; its container stays warm (unless the pool does not keep it)."""
        warm = slot.warm
        if warm is None:
            return
        with self._changed:
            warm.checks.pop(slot.source, None)
            warm.used = warm.sources[slot.source] = self._clock()
            kept = warm in self._warm
            self._changed.notify_all()
        if not kept and not warm.checks:
            self._remove_all([warm])

    def evict(self, warm: Warm, reason: str) -> None:
        """The container goes now (dead, or its check could not be ended alone), with every
        check in it."""
        with self._changed:
            if warm in self._warm:
                self._warm.remove(warm)
                self._evictions[reason] += 1
            self._changed.notify_all()
        self._remove_all([warm])

    def stop_run(self, run: str) -> bool:
        """End the check that serves ``run`` (its sender stopped it), alone; whether one
        was under way here."""
        with self._changed:
            slots = [*self._pending, *(s for w in self._warm for s in w.checks.values())]
            found = next((s for s in slots if s.run == run and run), None)
            if found is None:
                return False
            found.stopped = True
            cancel = found.cancel
            self._changed.notify_all()  # one waiting for room gives up
        if cancel is not None:
            cancel()
        return True

    # --- upkeep -----------------------------------------------------------------------

    def evict_idle(self, reason: str) -> bool:
        """Remove the least recently used idle one, of any team (the quota has no room for a
        new one); whether there was one."""
        gone: list[Warm] = []
        with self._changed:
            idle = next((w for w in self._warm if not w.checks), None)
            if idle is not None:
                self._drop(idle, reason, gone)
        self._remove_all(gone)
        return idle is not None

    def expire(self) -> int:
        """Remove the expired idle ones, and forget sources unused for ``idle_seconds``; how
        many containers went."""
        now = self._clock()
        gone: list[Warm] = []
        with self._changed:
            for warm in list(self._warm):
                reason = warm.expired(self.limits, now)
                if reason and not warm.checks:  # a busy one past its age goes once idle
                    self._drop(warm, reason, gone)
                    continue
                for source, used in list(warm.sources.items()):
                    if source not in warm.checks and now - used >= self.limits.idle_seconds:
                        del warm.sources[source]
        self._remove_all(gone)
        return len(gone)

    def drain(self) -> None:
        """Remove them all (the service stops); one started later serves its check only."""
        with self._changed:
            self._closed = True
            gone = list(self._warm)
            self._warm.clear()
            self._evictions[DRAIN] += len(gone)
            self._changed.notify_all()
        self._remove_all(gone)

    def counts(self) -> WarmCounts:
        with self._changed:
            return WarmCounts(
                alive=len(self._warm),
                reuses=self._reuses,
                starts=self._starts,
                evictions=dict(self._evictions),
                sources=sum(len(w.sources) for w in self._warm),
            )

    # --- under the lock ---------------------------------------------------------------

    def _source_busy(self, key: str, source: str) -> bool:
        return any(w.key == key and source in w.checks for w in self._warm)

    def _room_for(self, key: str, source: str, gone: list[Warm]) -> Warm | None:
        """The container of ``key`` for ``source``: the one holding its directory if it has
        room, else the one with the fewest sources that has (expired ones skipped)."""
        now = self._clock()
        free = []
        for warm in list(self._warm):
            if warm.key != key:
                continue
            if (reason := warm.expired(self.limits, now)) and not warm.checks:
                self._drop(warm, reason, gone)
                continue
            if reason is None and len(warm.checks) < self.limits.checks_at_once:
                free.append(warm)
        home = next((w for w in free if source in w.sources), None)
        return home or min(free, key=lambda w: len(w.sources), default=None)

    def _occupy(self, warm: Warm, slot: Slot, reused: bool) -> None:
        slot.warm, slot.reused = warm, reused
        warm.checks[slot.source] = slot
        warm.sources[slot.source] = warm.used = self._clock()
        warm.served += 1
        if reused:
            self._reuses += 1
        if warm in self._warm:
            self._warm.remove(warm)
            self._warm.append(warm)

    def _can_start(self, team: str, gone: list[Warm]) -> bool:
        """Whether one more container fits both caps (evicting least recently used idle
        ones to make room); none after the drain."""
        if self._closed:
            return True  # it serves its check only (admit keeps nothing)
        for reason, cap, counts in (
            (TEAM_CAP, self.limits.per_team, lambda t: t == team),
            (REPLICA_CAP, self.limits.per_replica, lambda t: True),
        ):
            members = [w for w in self._warm if counts(w.team)]
            idle = [w for w in members if not w.checks]  # least recently used first
            starting = sum(1 for t in self._starting.values() if counts(t))
            while len(members) + starting >= cap:
                if not idle:
                    return False
                victim = idle.pop(0)
                members.remove(victim)
                self._drop(victim, reason, gone)
        return True

    def _drop(self, warm: Warm, reason: str, gone: list[Warm]) -> None:
        self._warm.remove(warm)
        self._evictions[reason] += 1
        gone.append(warm)

    def _remove_all(self, gone: list[Warm]) -> None:
        for warm in gone:
            with self._changed:
                if warm.removed:
                    continue
                warm.removed = True
            self._remove(warm.handle)
