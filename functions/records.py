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
from functions.model import Outcome
from storage import Store, get_json, put_json
from storage.base import key_for_url
from storage.errors import ObjectExists, ObjectNotFound


def record_outcome(store: Store, run: str, outcome: Outcome) -> Outcome:
    """Store ``results/<run>.json``; if a record exists already, the first one wins."""
    try:
        put_json(store, keys.result_key(run), result_body(outcome))
    except ObjectExists:
        return Outcome.from_record(get_json(store, keys.result_key(run)))
    return outcome


def record_if_absent(store: Store, run: str, outcome: Outcome) -> None:
    """Store ``results/<run>.json`` unless it exists (one write, no read)."""
    try:
        put_json(store, keys.result_key(run), result_body(outcome))
    except ObjectExists:
        pass


def result_body(outcome: Outcome) -> dict[str, Any]:
    """The result record: the outcome and ``finished_at`` (epoch seconds, when it was
    recorded: ``functions.run_index`` shows a run's duration from it)."""
    return {**outcome.as_record(), "finished_at": round(time.time(), 3)}


def read_outcome(store: Store, run: str) -> Outcome | None:
    try:
        return Outcome.from_record(get_json(store, keys.result_key(run)))
    except ObjectNotFound:
        return None


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
