"""The version history of a resource, kept in the store (``history/<resource-key>.json``).

A resource is identified by ``keys.resource_key`` (an HMAC of image and source, as for cache
keys, so the key reveals nothing of the source). Its record holds the versions its checks
found, oldest first and bounded (``HISTORY_LIMIT``), and when it was last checked::

    {"versions": [{"ref": "a"}, {"ref": "b"}], "checked_at": 1767225600.0}

Merging follows Concourse: a check prints versions oldest first, its last one the latest.
When a check finds a version not yet known, the versions it printed move to the end in its
order (Concourse's check order), so the history's last version is the check's latest; a
check that finds nothing new (a late replica, a repeated tick) leaves the order alone, so a
stale check cannot make an old version the latest again. Versions over the limit drop off the
oldest end (a dropped version found again counts as new). Updates go through the store's
compare-and-swap (``storage.compare_and_swap``): replicas checking one resource at once lose no version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from functions import keys
from functions.model import HistoryPlan
from storage import Store
from storage.compare_and_swap import update_record

Version = dict[str, str]
LATEST_KNOWN = "latest-known"  # the request's "version" that continues from the history


@dataclass(frozen=True)
class History:
    versions: tuple[Version, ...] = ()  # oldest first
    checked_at: float | None = None  # epoch seconds of the last successful check

    @property
    def latest(self) -> Version | None:
        return self.versions[-1] if self.versions else None


def parse(data: bytes | None) -> History:
    """The history in a record's bytes; ``None`` or unreadable bytes are an empty history
    (the next check writes a good one)."""
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        value = {}
    versions = value.get("versions") if isinstance(value, dict) else None
    checked_at = value.get("checked_at") if isinstance(value, dict) else None
    return History(
        versions=tuple(v for v in versions or () if _is_version(v)),
        checked_at=float(checked_at) if isinstance(checked_at, (int, float)) else None,
    )


def dump(history: History) -> bytes:
    body = {"versions": list(history.versions), "checked_at": history.checked_at}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def merge(
    known: Sequence[Version], found: Sequence[Version], limit: int
) -> tuple[tuple[Version, ...], list[Version]]:
    """The versions after a check found ``found`` (see the module docstring), and the found
    versions that were not known, in the check's order."""
    printed = _unique(found)
    known_ids = {_identity(v) for v in known}
    new = [v for v in printed if _identity(v) not in known_ids]
    if not new:
        return tuple(known)[-limit:], []
    printed_ids = {_identity(v) for v in printed}
    merged = [v for v in known if _identity(v) not in printed_ids] + printed
    return tuple(merged[-limit:]), new


def since(history: History, version: Version | None) -> list[Version]:
    """What a check from ``version`` prints when answered from the history: ``version`` and
    the versions after it, or the latest alone if ``version`` is unknown (or None)."""
    ids = [_identity(v) for v in history.versions]
    if version is not None and _identity(version) in ids:
        return list(history.versions[ids.index(_identity(version)) :])
    return [history.latest] if history.latest is not None else []


def read(store: Store, resource_key: str) -> History:
    record = store.read_record(keys.history_record_key(resource_key))
    return parse(record.data if record else None)


def record_check(
    store: Store, plan: HistoryPlan, found: Sequence[Version], now: float
) -> list[Version]:
    """Add what a successful check found to the resource's history (compare-and-swap, retried
    on a lost race); return the found versions that were new to it."""

    def change(current: bytes | None) -> tuple[bytes, list[Version]]:
        history = parse(current)
        versions, new = merge(history.versions, found, plan.limit)
        return dump(History(versions, max(now, history.checked_at or now))), new

    return update_record(store, keys.history_record_key(plan.resource_key), change)


def _unique(versions: Sequence[Version]) -> list[Version]:
    """``versions`` without repeats; a version printed twice counts where it was last."""
    last = {_identity(v): i for i, v in enumerate(versions)}
    return [v for i, v in enumerate(versions) if last[_identity(v)] == i]


def _identity(version: Version) -> bytes:
    return keys.canonical_json(version)


def _is_version(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )
