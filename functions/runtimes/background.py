"""The background work of a runtime, bounded, and what it waits for when the service stops.

``BackgroundRuns``: at most ``ASYNC_RUN_LIMIT`` asynchronous runs (``Runtime.start``) proceed
at once per runtime; later ones wait their turn in order (each already has its 202, so none is
dropped). ``close`` waits for all of them, queued ones included: each owes its requester a
reply. ``RunsInFlight``: the synchronous runs under way, which ``close`` waits for too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from enum import Enum
from typing import Any

from functions.errors import SinkRefused, Unavailable, failure_kind
from functions.ledger import lease
from functions.logs import fields
from functions.model import Outcome, Task
from functions.sink import post_outcome
from functions.steps.outcome import failed
from storage import Store

log = logging.getLogger("functions.runtimes")

# As many as the service's default THREADS (16) serves synchronously: going async does not
# multiply the containers or watches one instance keeps open.
ASYNC_RUN_LIMIT = 16
STOPPING = "the service is stopping; retry"
Ended = Callable[[Outcome], None]  # told the outcome of a started task, once it has ended


class BackgroundRuns:
    def __init__(self, name: str, limit: int = ASYNC_RUN_LIMIT) -> None:
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix=name)

    def submit(self, run: Callable[..., None], *args: Any) -> None:
        """Run ``run(*args)`` in the background; it handles (logs, replies) its own errors.
        Once closed (or the interpreter is exiting) it takes nothing: ``Unavailable``."""
        try:
            self._pool.submit(run, *args)
        except RuntimeError as err:
            raise Unavailable(STOPPING) from err

    def close(self) -> None:
        """Wait until every submitted run has ended; no new ones are taken."""
        self._pool.shutdown(wait=True)


class RunsInFlight:
    """Admits runs until closed; ``close`` then waits for the admitted ones to end."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._count = 0
        self._closed = False

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """One run's span; ``Unavailable`` (a 503: retry) once closed."""
        with self._changed:
            if self._closed:
                raise Unavailable(STOPPING)
            self._count += 1
        try:
            yield
        finally:
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.wait_for(lambda: self._count == 0)


class InRequest:
    """Asynchronous runs that end within their request (a warm check: tens of milliseconds)
    run where the request is answered, and post their reply before its 202: a process that
    dies before then leaves a delivery its sender retries, never a reply that nobody owes
    (docs/warm-checks.md). One at a time per run id: a redelivery that comes meanwhile is a
    503, and its retry finds the recorded answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[str] = set()

    def run(
        self,
        store: Store,
        sink: str,
        task: Task,
        ended: Ended | None,
        run: Callable[[], Outcome | None],
    ) -> bool:
        """``run()`` here, its end as ``end_async_run`` makes it (``IN_REQUEST``): True; False
        if ``run`` returned None (it could not run this way: start the task as any other)."""
        with self._lock:
            if task.run_id in self._runs:
                raise Unavailable(f"run {task.run_id} is under way here; retry for its answer")
            self._runs.add(task.run_id)
        try:
            outcome = run()
            if outcome is None:
                return False
            end_async_run(store, sink, task, outcome, ended, AsyncEnd.IN_REQUEST)
            return True
        finally:
            with self._lock:
                self._runs.discard(task.run_id)


def outcome_of_async(task: Task, run: Callable[[], Outcome]) -> Outcome:
    """``run()``'s outcome; after a 202 nobody redelivers, so an exception is the requester's
    failure reply (logged here), never lost."""
    try:
        return run()
    except Exception as err:
        log.exception("asynchronous task failed", extra=fields(run_id=task.run_id))
        return failed(task.action, failure_kind(err), f"the task could not run: {err}")


class AsyncEnd(Enum):
    """How an asynchronous run ended, as far as its lease and its reply go."""

    ENDED = "ended"  # the task ended: the lease goes, the function posts the reply
    COLLECT_REPLIED = "collect_replied"  # ended, and its collect step posted the reply
    MAY_STILL_RUN = "may_still_run"  # following it failed: the task keeps its lease
    IN_REQUEST = "in_request"  # ended (or refused at its start) while its request is answered


def end_async_run(
    store: Store,
    sink: str,
    task: Task,
    outcome: Outcome,
    ended: Ended | None,
    how: AsyncEnd = AsyncEnd.ENDED,
) -> None:
    """The end of an asynchronous run (``Runtime.start``), the same in every runtime:
    1. its check lease is let go, unless the task ``MAY_STILL_RUN`` (following it failed:
       its own ``collect`` lets go then, or the lease expires). Whether the outcome was
       recorded or not (a store down), a waiter then answers from the record or runs the
       check itself;
    2. the end is reported (``ended``: metrics, the log line, spans);
    3. the reply is posted to K_SINK, unless ``COLLECT_REPLIED`` (``collect`` in a task pod
       posted it). After a 202 nobody redelivers, so a failed post is logged; ``IN_REQUEST``
       (a run that ended, or a start refused, while its request is still answered: before
       any 202) makes a refused post a 503, so that the redelivery replays the record and
       posts again."""
    if how is not AsyncEnd.MAY_STILL_RUN:
        lease.release_held(store, task.lease)
    report_end(ended, task, outcome)
    if how is AsyncEnd.COLLECT_REPLIED:
        return
    try:
        post_outcome(sink, task, outcome)
    except SinkRefused as err:
        if how is AsyncEnd.IN_REQUEST:
            raise Unavailable(f"cannot post the reply: {err}") from err
        log.exception("cannot post the reply", extra=fields(run_id=task.run_id))
    except Exception:
        log.exception("cannot post the reply", extra=fields(run_id=task.run_id))


def report_end(ended: Ended | None, task: Task, outcome: Outcome) -> None:
    """Tell ``Runtime.start``'s ``ended`` how a task ended (metrics, logs); its trouble never
    stops the task's reply."""
    if ended is None:
        return
    try:
        ended(outcome)
    except Exception:
        log.exception("cannot report the end of a task", extra=fields(run_id=task.run_id))
