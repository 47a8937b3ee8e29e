"""Read-modify-write of a record on any store: the compare-and-swap loop over
``Store.read_record`` / ``Store.write_record`` (see ``storage.base`` for their contract).

Two writers that read the same state cannot both replace it: one gets ``PreconditionFailed``,
reads the winner's bytes and applies its change to them, so no change is lost.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from storage.base import Store
from storage.store_errors import PreconditionFailed

T = TypeVar("T")
ATTEMPTS = 50
# Backoff after a lost race: a random pause below min(MAX_PAUSE, FIRST_PAUSE * 2**attempt),
# so writers that collided do not collide again in lockstep.
FIRST_PAUSE = 0.01
MAX_PAUSE = 0.5

Change = Callable[[bytes | None], tuple[bytes | None, T]]


def update_record(store: Store, key: str, change: Change[T], *, attempts: int = ATTEMPTS) -> T:
    """Apply ``change`` to the record ``key`` until the write sticks; return what ``change``
    returned beside the bytes on the attempt that stuck.

    ``change(current)`` gets the record's bytes (``None``: no record yet) and returns the new
    bytes (``None``: leave the record as it is, nothing is written) and a result for the
    caller. It runs once per attempt, on the state of that attempt, so it must not act on
    anything but its return value. Raises ``PreconditionFailed`` after ``attempts`` lost
    races, and the store's other errors as they come.
    """
    for attempt in range(attempts):
        current = store.read_record(key)
        data, result = change(None if current is None else current.data)
        if data is None:
            return result
        try:
            store.write_record(key, data, None if current is None else current.token)
        except PreconditionFailed:
            time.sleep(random.uniform(0, min(MAX_PAUSE, FIRST_PAUSE * 2**attempt)))
            continue
        return result
    raise PreconditionFailed(f"record {key}: still changing after {attempts} attempts")
