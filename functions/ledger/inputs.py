"""Uploaded inputs expire. A directory handed over for a put (``artifact pack`` through the
artifacts service, ``run put --input``) is stored under the day it came
(``keys.input_key``: ``artifacts/inputs/<YYYY-MM-DD>/<name>``); one from a day more than
``INPUTS_TTL_DAYS`` before today is deleted, with its team record.

On S3 and GCS a lifecycle rule does this (``knative/store-lifecycle/``: the prefix
``artifacts/inputs/``, expired after the same days); the file store has none, so the services
that take inputs there (the artifacts service, the put service) sweep it once an hour
(``sweeper``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from functions import keys
from functions.periodic import Periodic
from storage import Store

SWEEP_SECONDS = 3600.0
log = logging.getLogger("functions")


def sweep_inputs(store: Store, ttl_days: int, now: datetime) -> int:
    """Delete the inputs handed over before ``ttl_days`` days ago (and their team records);
    how many objects went. Keys without a day (an older layout) are the lifecycle rule's."""
    cutoff = (now.astimezone(UTC) - timedelta(days=ttl_days)).date()
    removed = 0
    for key in list(store.list(keys.INPUTS)):
        day = _day_of(key)
        if day is not None and day < cutoff:
            store.delete(key)
            removed += 1
    if removed:
        log.info("removed %d expired input object(s) from before %s", removed, cutoff)
    return removed


def sweeper(
    store: Store, ttl_days: int, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> Periodic | None:
    """The hourly sweep for a file store (``start()`` it in the serving process); None for
    the stores whose lifecycle rules expire inputs."""
    if not store.url.startswith("file://"):
        return None
    return Periodic(
        "inputs-sweep",
        SWEEP_SECONDS,
        lambda: sweep_inputs(store, ttl_days, clock()),
        first_now=True,
    )


def _day_of(key: str) -> date | None:
    day = key[len(keys.INPUTS) :].partition("/")[0]
    try:
        return date.fromisoformat(day)
    except ValueError:
        return None
