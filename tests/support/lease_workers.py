"""Work for other processes in the lease tests (importable by a spawned interpreter)."""

from __future__ import annotations

import time
from typing import Any

from functions.ledger import lease
from storage import open_store


def take_after(url: str, key: str, run: str, barrier: Any) -> bool:
    """Read the lease, wait for every other process to have read it too, then try to take
    it: whether this process holds it."""
    store = open_store(url)
    seen = lease.read(store, key)
    barrier.wait(60)
    if seen is not None and not seen.lease.free(time.time()):
        return False
    return lease.take(store, key, seen, run=run, ttl=60, now=time.time()) is not None
