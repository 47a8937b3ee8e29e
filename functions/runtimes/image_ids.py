"""Image references resolved to the engine's image ids, remembered for a while.

A warm check's key holds its image's id (``warm.warm_key``), so that a tag moved to a new
image gets a new warm container. Asking the engine on every check is one more API request
per check than the exec itself needs; remembered for ``WARM_CHECK_IMAGE_SECONDS`` (60), a
moved tag is seen within that time, as Concourse sees a resource type's new version on its
type's next check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

LIMIT = 1024  # references remembered; past it, all are forgotten (each costs one inspect)


class ImageIds:
    def __init__(self, seconds: float, now: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._now = now
        self._ids: dict[str, tuple[str, float]] = {}  # reference -> (id, when resolved)
        self._lock = threading.Lock()

    def get(self, reference: str) -> str | None:
        """The id resolved for ``reference`` less than ``seconds`` ago, or None."""
        with self._lock:
            found = self._ids.get(reference)
            if found is None or self._now() - found[1] >= self._seconds:
                return None
            return found[0]

    def put(self, reference: str, image_id: str) -> None:
        if self._seconds <= 0:
            return
        with self._lock:
            if len(self._ids) >= LIMIT:
                self._ids.clear()
            self._ids[reference] = (image_id, self._now())

    def forget(self, reference: str) -> None:
        with self._lock:
            self._ids.pop(reference, None)
