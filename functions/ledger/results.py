"""The records a run leaves in the store (``functions.keys`` names them): its result
``results/<run-id>.json`` (written once: the first record wins, so every delivery of a
request replays the same answer), its log, and the cache records of gets. Every runtime,
the service and the in-pod steps read and write them through here.
"""

from __future__ import annotations

import io
import time
from typing import Any

from functions import keys
from functions.errors import RequestIdReused
from functions.model import Outcome
from storage import Store, get_json, put_json
from storage.base import key_for_url
from storage.store_errors import ObjectExists, ObjectNotFound


def record_outcome(store: Store, run: str, outcome: Outcome, *, request: str) -> Outcome:
    """Store ``results/<run>.json`` with the request's digest (``keys.request_digest``); if a
    record exists already, the first one wins (``RequestIdReused`` if another request's)."""
    try:
        put_json(store, keys.result_key(run), result_body(outcome, request))
    except ObjectExists:
        stored = read_outcome(store, run, request=request)
        assert stored is not None  # written once, never deleted but by expiry
        return stored
    return outcome


def record_if_absent(store: Store, run: str, outcome: Outcome, *, request: str) -> None:
    """Store ``results/<run>.json`` unless it exists (one write, no read)."""
    try:
        put_json(store, keys.result_key(run), result_body(outcome, request))
    except ObjectExists:
        pass


def result_body(outcome: Outcome, request: str) -> dict[str, Any]:
    """The result record: the outcome, the request's digest and ``finished_at`` (epoch
    seconds, when it was recorded: ``functions.ledger.run_index`` shows a run's duration from it)."""
    body = {**outcome.as_record(), "finished_at": round(time.time(), 3)}
    return {**body, "request": request} if request else body


def read_outcome(
    store: Store, run: str, *, request: str | None, since: float | None = None
) -> Outcome | None:
    """The stored outcome of ``run``, or None. With ``request`` (its digest), a record of
    another request raises ``RequestIdReused``: a pair reused for other data never gets
    this reply. ``request=None``: any request's (another run's result, read on purpose).
    ``since``: a record finished before that time (epoch seconds) counts as none."""
    try:
        record = get_json(store, keys.result_key(run))
    except ObjectNotFound:
        return None
    recorded = record.get("request")
    if request is not None and recorded is not None and recorded != request:
        raise RequestIdReused()
    if since is not None and float(record.get("finished_at") or 0) < since:
        return None
    return Outcome.from_record(record)


def read_cache(
    store: Store, cache_key: str, record: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The reply data of a cached get, or None on a miss. A record whose artifact is gone
    (e.g. expired by a bucket lifecycle rule) is removed, so the get runs and stores both
    afresh. ``record``: the cache record if known already (records are written once), so
    only the artifact is looked for."""
    record_key = keys.cache_record_key(cache_key)
    if record is None:
        try:
            record = get_json(store, record_key)
        except ObjectNotFound:
            return None
    key = key_for_url(store, record.get("artifact", {}).get("url", ""))
    if key is None or store.stat(key) is None:
        store.delete(record_key)
        return None
    return {**record, "cached": True}


def write_once(store: Store, key: str, body: bytes) -> None:
    try:
        store.put(key, io.BytesIO(body))
    except ObjectExists:
        pass  # a redelivered run already stored it
