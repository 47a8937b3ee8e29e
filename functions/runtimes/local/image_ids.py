"""Image references resolved to the engine's image ids, remembered for a while.

A warm check's key holds its image's id (``warm.check.pool_key``), so that a tag moved to a new
image gets a new warm container. Asking the engine on every check is one more API request
per check than the exec itself needs; remembered for ``WARM_CHECK_IMAGE_SECONDS`` (60), a
moved tag is seen within that time, as Concourse sees a resource type's new version on its
type's next check.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from functions.bounded_cache import BoundedCache

LIMIT = 1024  # references remembered, the least recently used forgotten first


class ImageIds:
    def __init__(self, seconds: float, now: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._now = now
        # reference -> (id, when resolved)
        self._ids: BoundedCache[str, tuple[str, float]] = BoundedCache(LIMIT)

    def get(self, reference: str) -> str | None:
        """The id resolved for ``reference`` less than ``seconds`` ago, or None."""
        found = self._ids.get(reference)
        if found is None or self._now() - found[1] >= self._seconds:
            return None
        return found[0]

    def put(self, reference: str, image_id: str) -> None:
        if self._seconds > 0:
            self._ids.put(reference, (image_id, self._now()))

    def forget(self, reference: str) -> None:
        self._ids.pop(reference)
