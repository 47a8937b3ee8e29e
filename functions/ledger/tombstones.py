"""Tombstones of stopped runs: a sender's word that one of its requests must not run
(``functions.service.stop_requests`` takes it). Written before the runtime is told to stop the run,
read before a run starts and once more after an asynchronous start: so a stop that comes
first keeps the run from ever starting, and one that crosses its start still finds the task it
started. Written once, never changed; expired with the results (``keys.stop_key``)."""

from __future__ import annotations

import time

from functions import keys
from storage import Store, put_json
from storage.store_errors import ObjectExists


def record(store: Store, run: str) -> None:
    """Mark ``run`` stopped (a second stop of it changes nothing)."""
    try:
        put_json(store, keys.stop_key(run), {"stopped_at": round(time.time(), 3)})
    except ObjectExists:
        pass


def stopped(store: Store, run: str) -> bool:
    return store.stat(keys.stop_key(run)) is not None
