"""A job run every so often on a daemon thread of its own, until stopped: the local runtime's
container sweep, the warm reaper, a check lease's renewal, the Tekton controller's Lease.

A job that raises is logged and runs again next time (a bug must not end a service's upkeep);
a job that returns ``False`` (that object: not 0, not None) ends the loop (what it keeps is gone). ``stop`` waits for a round
under way to finish."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("functions")


class Periodic:
    def __init__(
        self,
        name: str,
        seconds: float,
        job: Callable[[], object],
        *,
        first_now: bool = False,
        stopped: threading.Event | None = None,
    ) -> None:
        """``first_now``: run at once, then every ``seconds`` (else the first run waits too).
        ``stopped``: an event shared with its owner (setting it ends the loop), else its own."""
        self.name = name
        self.stopped = stopped or threading.Event()
        self._seconds = seconds
        self._job = job
        self._first_now = first_now
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        if not self._first_now and self.stopped.wait(self._seconds):
            return
        while not self.stopped.is_set():
            try:
                if self._job() is False:
                    return
            except Exception:  # a bug: logged, and the next round runs
                log.exception("%s failed", self.name)
            if self.stopped.wait(self._seconds):
                return
