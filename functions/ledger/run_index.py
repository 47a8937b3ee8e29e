"""An index of runs by the hour they started, so that "what ran lately" is a bounded listing.

When a service starts a run it writes ``runs/<YYYY-MM-DDTHH>/<run-id>.json`` (UTC hour),
once (a redelivery finds it written), holding no secret::

    {"run_id": "…", "action": "get", "type": "git", "image": "…", "started_at": 1767225600.0}

The run's outcome is its result record (``results/<run-id>.json``, whose ``finished_at``
gives the duration), read when listing. Written at the start rather than with the result
because only the service knows the request's type name, and so that a run still under way
(or one that never recorded a result) is listed too. Runs answered without a run (a cache
hit, a stored result, a check answered from its history) are not runs and are not indexed.
Expire ``runs/`` with ``results/`` (same lifecycle rule).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from functions import keys
from storage import ObjectExists, ObjectNotFound, Store, get_json, put_json

HOUR = 3600
READERS = 8  # records read at once when listing (a remote store answers each in ~ms)


@dataclass(frozen=True)
class RunRow:
    """One run as ``python -m functions runs`` lists it."""

    run_id: str
    action: str
    type_name: str | None
    image: str
    started_at: float
    outcome: str  # succeeded, failed, or unfinished (no result record yet)
    kind: str | None = None  # the failure kind
    seconds: float | None = None  # start to result record


def hour_of(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H", time.gmtime(when))


def entry_key(run: str, started: float) -> str:
    return f"runs/{hour_of(started)}/{run}.json"


def record_start(
    store: Store, *, run: str, action: str, type_name: str | None, image: str, started: float
) -> None:
    """Index a run as it starts (write-once: a redelivery's start keeps the first)."""
    entry = {
        "run_id": run,
        "action": action,
        "type": type_name,
        "image": image,
        "started_at": round(started, 3),
    }
    try:
        put_json(store, entry_key(run, started), entry)
    except ObjectExists:
        pass


def hour_prefixes(since: float, until: float) -> list[str]:
    """The index folders of the hours from ``since`` to ``until``, oldest first."""
    first, last = int(since // HOUR), int(until // HOUR)
    return [f"runs/{hour_of(hour * HOUR)}/" for hour in range(first, last + 1)]


def list_runs(
    store: Store,
    *,
    since: float,
    until: float,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> list[RunRow]:
    """The runs started from ``since`` to ``until``, oldest first; ``progress(done, total)``
    is called as records are read."""
    entries = [key for prefix in hour_prefixes(since, until) for key in store.list(prefix)]
    rows: list[RunRow] = []
    with ThreadPoolExecutor(READERS) as pool:
        for done, row in enumerate(pool.map(lambda key: _row(store, key), entries), 1):
            progress(done, len(entries))
            if row is not None and since <= row.started_at <= until:
                rows.append(row)
    return sorted(rows, key=lambda row: (row.started_at, row.run_id))


def _row(store: Store, key: str) -> RunRow | None:
    try:
        entry = get_json(store, key, limit=64 * 1024)
    except (ObjectNotFound, ValueError):  # expired meanwhile, or not an index entry
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("run_id"), str):
        return None
    try:
        result = get_json(store, keys.result_key(entry["run_id"]))
    except ObjectNotFound:
        result = None
    return row_of(entry, result)


def row_of(entry: dict[str, Any], result: dict[str, Any] | None) -> RunRow:
    """A listing row from an index entry and the run's result record (None: none yet)."""
    started = float(entry.get("started_at") or 0)
    outcome, kind, seconds = "unfinished", None, None
    if isinstance(result, dict):
        error = result.get("error")
        outcome = "failed" if isinstance(error, dict) else "succeeded"
        kind = str(error.get("kind")) if isinstance(error, dict) else None
        finished = result.get("finished_at")
        if isinstance(finished, (int, float)):
            seconds = max(0.0, finished - started)
    return RunRow(
        run_id=str(entry["run_id"]),
        action=str(entry.get("action") or ""),
        type_name=entry.get("type") if isinstance(entry.get("type"), str) else None,
        image=str(entry.get("image") or ""),
        started_at=started,
        outcome=outcome,
        kind=kind,
        seconds=seconds,
    )
