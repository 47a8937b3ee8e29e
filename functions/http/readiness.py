"""``/readyz``: whether this replica can serve now, i.e. its store and its runtime (the
container engine or the Kubernetes API) answer. Apart from ``/healthz`` (liveness: the
process serves HTTP), so that an outage of either takes the replica out of the Service's
endpoints instead of restarting it, which would not help."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from functions.errors import Unavailable
from functions.runtimes import Runtime
from storage import Store
from storage.store_errors import StorageError

PROBE_KEY = "health/readyz.json"  # read, never written: a missing record is an answer too
READY_SECONDS = 5.0  # a success is trusted this long: probes do not hammer the store


class Readiness:
    def __init__(
        self, store: Store, runtime: Runtime, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._runtime = runtime
        self._clock = clock
        self._ready_until = 0.0

    def probe(self) -> tuple[int, dict[str, Any]]:
        """200 and ``{"status": "ready"}``, or 503 with what does not answer and why."""
        if self._clock() < self._ready_until:
            return 200, {"status": "ready"}
        problems = {}
        for part, call in (("store", self._store_answers), ("runtime", self._runtime.ready)):
            try:
                call()
            except (Unavailable, StorageError) as err:  # not ready: say which and why
                problems[part] = f"{type(err).__name__}: {err}"[:300]
        if problems:
            return 503, {"status": "not ready", **problems}
        self._ready_until = self._clock() + READY_SECONDS
        return 200, {"status": "ready"}

    def _store_answers(self) -> None:
        self._store.read_record(PROBE_KEY)
