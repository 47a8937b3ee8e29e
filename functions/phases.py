"""Where a run spends its time: a runtime times its phases with a ``PhaseClock`` and hands
them back on the ``Outcome``; the service logs them, observes them as a histogram and
exports them as trace spans."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace

from functions.model import Outcome, Phase


class PhaseClock:
    """The phases of one run, in the order they began."""

    def __init__(self) -> None:
        self._phases: list[Phase] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (also when it raises: the time was spent)."""
        start = time.time_ns()
        try:
            yield
        finally:
            self._phases.append(Phase(name, start, time.time_ns()))

    @property
    def phases(self) -> tuple[Phase, ...]:
        return tuple(self._phases)

    def attach(self, outcome: Outcome) -> Outcome:
        return replace(outcome, phases=(*outcome.phases, *self._phases))


def timed(clock: PhaseClock | None, name: str) -> AbstractContextManager[None]:
    """``clock.phase(name)``, or nothing when the caller keeps no clock."""
    return clock.phase(name) if clock is not None else nullcontext()


def seconds_by_phase(phases: Iterable[Phase]) -> dict[str, float]:
    """Seconds per phase name (a name that recurs is summed), rounded to milliseconds."""
    totals: dict[str, float] = {}
    for phase in phases:
        totals[phase.name] = totals.get(phase.name, 0.0) + phase.seconds
    return {name: round(seconds, 3) for name, seconds in totals.items()}
