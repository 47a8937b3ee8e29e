"""The background work of asynchronous runs (``Runtime.start``), bounded.

At most ``ASYNC_RUN_LIMIT`` runs proceed at once per runtime; later ones wait their turn in
order (each already has its 202, so none is dropped). ``close`` waits for all of them,
queued ones included: each owes its requester a reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from functions.logs import fields
from functions.model import Outcome, Task

log = logging.getLogger("functions.runtimes")

# As many as the service's default THREADS (16) serves synchronously: going async does not
# multiply the containers or watches one instance keeps open.
ASYNC_RUN_LIMIT = 16


class BackgroundRuns:
    def __init__(self, name: str, limit: int = ASYNC_RUN_LIMIT) -> None:
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix=name)

    def submit(self, run: Callable[..., None], *args: Any) -> None:
        """Run ``run(*args)`` in the background; it handles (logs, replies) its own errors."""
        self._pool.submit(run, *args)

    def close(self) -> None:
        """Wait until every submitted run has ended; no new ones are taken."""
        self._pool.shutdown(wait=True)


def report_end(ended: Callable[[Outcome], None] | None, task: Task, outcome: Outcome) -> None:
    """Tell ``Runtime.start``'s ``ended`` how a task ended (metrics, logs); its trouble never
    stops the task's reply."""
    if ended is None:
        return
    try:
        ended(outcome)
    except Exception:
        log.exception("cannot report the end of a task", extra=fields(run_id=task.run_id))
