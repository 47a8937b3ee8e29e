"""One check per resource across replicas, through the resource's lease (``functions.ledger.lease``).

The caller that takes the lease runs the check; the others wait, polling the lease with
backoff, for the holder's run to end, then take its stored result (``results/<run>.json``,
written before the holder releases) if it succeeded. A waiter whose holder failed (another
request's failure, its log tail, is never a waiter's answer), released without a result (its
run raised, e.g. the engine was unreachable) or let the lease expire (its replica died)
takes the lease itself, so one of the waiters runs the check. Leases are per team
(``keys.resource_key``): a waiter waits only for a run of its own team. A waiter that slept through
that waiter's whole run finds the lease released under it, and takes its result if it was
recorded after the waiter came (not a result a redelivered run found stored from before).
Waiting is bounded by ``timeout``: past it the request is ``Unavailable`` (503; redelivery
tries again).

Two ways to hold it, one loop (``lead_or_wait``): ``run_or_wait`` runs the check in this
request and renews the lease meanwhile (sync replies); ``start_or_wait`` starts the check's
task, which releases the lease itself once it has recorded (async replies: nobody renews it,
so ``ttl`` covers the whole task). A waiter answers in its own HTTP response in both modes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from functions.errors import Unavailable
from functions.ledger import lease, results
from functions.model import LeaseHold, Outcome
from storage import Store

FIRST_PAUSE = 0.05  # seconds between lease reads at first; grows by GROWTH up to MAX_PAUSE
GROWTH = 1.5
MAX_PAUSE = 1.0

Led = TypeVar("Led")


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
    run id it belongs to (``run`` when this call ran ``work``). A lease held by ``run``
    itself is an earlier delivery's run, on another replica: waited for like any other."""

    def lead(held: lease.Claim) -> Outcome:
        with lease.kept(store, key, held, ttl=ttl):
            return work()

    return lead_or_wait(store, key, run=run, ttl=ttl, timeout=timeout, lead=lead)


def start_or_wait(
    store: Store,
    key: str,
    *,
    run: str,
    ttl: float,
    timeout: float,
    start: Callable[[LeaseHold], None],
    rejoin: bool = True,
) -> tuple[Outcome | None, str]:
    """``start(held)`` of a task that holds the lease ``key`` for ``ttl`` (and releases it
    itself): ``(None, run)``; or the outcome of the run that held it, with that run's id. A
    lease ``run`` holds already is its own earlier delivery's: started again when
    ``rejoin`` (the runtime finds a run id's task once started: a Job), else waited for like
    any other holder's. A ``start`` that raises releases the lease this call took (not one
    an earlier delivery took: its task may be running)."""

    def lead(claim: lease.Claim) -> None:
        held = LeaseHold(key, claim.lease.holder)
        try:
            start(held)
        except BaseException:
            lease.release_held(store, held)
            raise

    def start_again(claim: lease.Claim) -> None:
        start(LeaseHold(key, claim.lease.holder))

    return lead_or_wait(
        store,
        key,
        run=run,
        ttl=ttl,
        timeout=timeout,
        lead=lead,
        rejoin=start_again if rejoin else None,
    )


def lead_or_wait(
    store: Store,
    key: str,
    *,
    run: str,
    ttl: float,
    timeout: float,
    lead: Callable[[lease.Claim], Led],
    rejoin: Callable[[lease.Claim], Led] | None = None,
) -> tuple[Led | Outcome, str]:
    """``lead(claim)`` once this call has taken the lease ``key`` (``rejoin(claim)`` if it
    finds it held by ``run`` already and ``rejoin`` is given), with ``run``; else the stored
    outcome of the run that held it, with that run's id."""
    deadline, came = time.monotonic() + timeout, time.time()
    followed: str | None = None  # the holder's run whose result we wait for
    pause = FIRST_PAUSE
    while True:
        seen = lease.read(store, key)
        now = time.time()
        if followed is not None and (
            seen is None or seen.lease.run != followed or seen.lease.free(now)
        ):
            # The holder's run ended (or changed hands): its success, if it left one, is ours.
            done = _answer_of(store, followed, run)
            if done is not None:
                return done, followed
            if seen is not None and seen.lease.released and seen.lease.run != followed:
                # A run took the lease over while this call slept, and ended. Its result is
                # ours if it is newer than this request: replicas' clocks agree to well
                # under a check's run, and a skew can only cost a check run again.
                done = _answer_of(store, seen.lease.run, run, since=came)
                if done is not None:
                    return done, seen.lease.run
        if seen is None or seen.lease.free(now):
            held = lease.take(store, key, seen, run=run, ttl=ttl, now=now)
            if held is not None:
                return lead(held), run
            continue  # another waiter took it first: follow that one
        if rejoin is not None and seen.lease.run == run:
            return rejoin(seen), run
        followed = seen.lease.run
        if time.monotonic() + pause > deadline:
            raise Unavailable(f"the check of this resource by run {followed} did not end in time")
        time.sleep(pause)
        pause = min(pause * GROWTH, MAX_PAUSE)


def _answer_of(store: Store, holder: str, run: str, since: float | None = None) -> Outcome | None:
    """The stored outcome of the ``holder``'s run, if it may answer ``run``: a success, or
    anything ``run``'s own earlier delivery recorded. Another request's failure is not: its
    message and log tail are that request's, and its cause (a crafted version, a credential)
    may be too; the waiter runs its own check instead."""
    done = results.read_outcome(store, holder, request=None, since=since)  # maybe another's
    if done is None or (not done.succeeded and holder != run):
        return None
    return done
