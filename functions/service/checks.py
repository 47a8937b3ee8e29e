"""What the version history does for a check before it runs: ``"version": "latest-known"``
becomes the history's last version, and a resource checked less than its interval ago is
answered from the history without a run (``functions.ledger.history`` keeps the record); and the
answer of a check that waited for another replica's run of the same resource."""

from __future__ import annotations

from dataclasses import replace

from functions import keys
from functions.ledger import history
from functions.model import HistoryPlan, Outcome, Request
from storage import Store


def history_plan(request: Request, *, cache_secret: bytes, limit: int) -> HistoryPlan | None:
    """Where a check's versions are recorded (resolved source, the request's team: see
    ``keys.resource_key``), ``limit`` of them kept; None for get and put."""
    if request.action != "check":
        return None
    key = keys.resource_key(
        cache_secret,
        image=request.resource_type.image,
        source=request.source,
        team=request.build.team,
    )
    return HistoryPlan(resource_key=key, limit=limit)


def interval(request: Request) -> float:
    """The check interval in seconds: the request's ``check_every``, else its type's, else 0."""
    if request.check_every is not None:
        return request.check_every
    return request.resource_type.check_every or 0.0


def from_history(
    store: Store, request: Request, plan: HistoryPlan, now: float
) -> tuple[Request, Outcome | None, float | None]:
    """The check to run (``latest-known`` resolved: the history's last version, or none on a
    first check); if the resource was checked less than ``interval`` seconds before ``now``,
    its answer from the history; and the age of that last successful check in intervals
    (None without an interval or a check yet). Reads the history only when one of them
    needs it."""
    every = interval(request)
    if not request.latest_known and every <= 0:
        return request, None, None
    known = history.read(store, plan.resource_key)
    if request.latest_known:
        request = replace(request, version=known.latest)
    if known.checked_at is None or every <= 0:
        return request, None, None
    age = max(0.0, now - known.checked_at) / every
    if age >= 1:
        return request, None, age
    return request, answer(known, request), age


def answer(known: history.History, request: Request) -> Outcome:
    """A check answered from the history rather than by its own run: what a check from the
    request's version prints, nothing ``new`` (the run that found them announced them)."""
    return Outcome(
        action="check", data={"versions": history.since(known, request.version), "new": []}
    )


def joined_answer(store: Store, request: Request, plan: HistoryPlan) -> Outcome:
    """The answer of a check that waited for another run of its resource (of its team) that
    succeeded: (its versions may start from another version) the history after it. Another
    run's failure is never a waiter's answer (``shared_check`` runs the waiter's own)."""
    return answer(history.read(store, plan.resource_key), request)
