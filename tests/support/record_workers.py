"""Work for other processes in the record tests (importable by a spawned interpreter)."""

from __future__ import annotations

import json

from storage import open_store
from storage.compare_and_swap import update_record


def add_to_counter(url: str, key: str, name: str, times: int) -> int:
    """Append ``name`` to the JSON list in record ``key`` ``times`` times, one read-modify-write
    each; the number of writes that stuck."""

    def append(current: bytes | None) -> tuple[bytes, int]:
        items = json.loads(current) if current is not None else []
        return json.dumps([*items, name]).encode(), 1

    store = open_store(url)
    return sum(update_record(store, key, append) for _ in range(times))
