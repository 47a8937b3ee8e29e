"""One check per resource across replicas, through the resource's lease (``functions.lease``).

The caller that takes the lease runs the check; the others wait, polling the lease with
backoff, for the holder's run to end, then take its stored result (``results/<run>.json``,
written before the holder releases). A waiter whose holder released without a result (its
run raised, e.g. the engine was unreachable) or let the lease expire (its replica died)
takes the lease itself, so one of the waiters runs the check. Waiting is bounded by
``timeout``: past it the request is ``Unavailable`` (503; redelivery tries again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from functions import lease
from functions.errors import Unavailable
from functions.model import Outcome
from functions.task import steps
from storage import Store

FIRST_PAUSE = 0.05  # seconds between lease reads at first; grows by GROWTH up to MAX_PAUSE
GROWTH = 1.5
MAX_PAUSE = 1.0


def run_or_wait(
    store: Store,
    key: str,
    *,
    run: str,
    ttl: float,
    timeout: float,
    work: Callable[[], Outcome],
) -> tuple[Outcome, str]:
    """``work()`` under the lease ``key``, or the outcome of the run that held it; with the
    run id it belongs to (``run`` when this call ran ``work``)."""
    deadline = time.monotonic() + timeout
    followed: str | None = None  # the holder's run whose result we wait for
    pause = FIRST_PAUSE
    while True:
        seen = lease.read(store, key)
        now = time.time()
        if followed is not None and (
            seen is None or seen.lease.run != followed or seen.lease.free(now)
        ):
            # The holder's run ended (or changed hands): its result, if it left one, is ours.
            done = steps.read_outcome(store, followed)
            if done is not None:
                return done, followed
        if seen is None or seen.lease.free(now):
            held = lease.take(store, key, seen, run=run, ttl=ttl, now=now)
            if held is not None:
                with lease.kept(store, key, held, ttl=ttl):
                    return work(), run
            continue  # another waiter took it first: follow that one
        followed = seen.lease.run
        if time.monotonic() + pause > deadline:
            raise Unavailable(f"the check of this resource by run {followed} did not end in time")
        time.sleep(pause)
        pause = min(pause * GROWTH, MAX_PAUSE)
