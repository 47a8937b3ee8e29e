"""Sweeps of the local runtime: leftover task containers of finished runs, removed.

A service stopped or killed between storing a run's result and removing its container leaves
the container (and its work directory) behind. A sweep, at start and every ``SWEEP_SECONDS``,
removes each *exited* container carrying our label whose run has its result in this service's
store. It leaves alone what a redelivery would still use: running containers, created ones
(the redelivery removes them and starts afresh), and exited ones without a stored result (the
redelivery adopts them and reads their output). Services that share the engine but not the
store never touch each other's containers: the result lookup decides.

One engine list call per sweep and one store lookup per candidate. A sweep never fails
anything: trouble is logged and the next sweep tries again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from functions import keys
from functions.errors import Unavailable
from functions.logs import fields
from functions.periodic import Periodic
from functions.runtimes.labels import RUN_LABEL
from storage import Store
from storage.store_errors import StorageError

SWEEP_SECONDS = 300
RUN_ID = re.compile(r"[0-9a-f]{32}")  # keys.run_id: a label that is not one is not ours
log = logging.getLogger("functions.container")

# What the engine lists, per container: its id, state and labels (Docker's summary fields);
# trouble with the engine is ``Unavailable``.
Listing = Callable[[], Iterable[Mapping[str, Any]]]
Removal = Callable[[str, str], bool]  # (container id, run id) -> removed


def finished(listed: Iterable[Mapping[str, Any]], store: Store) -> Iterator[tuple[str, str]]:
    """(container id, run id) of each exited container whose run's result is in ``store``."""
    for summary in listed:
        run = str((summary.get("Labels") or {}).get(RUN_LABEL, ""))
        if summary.get("State") != "exited" or not RUN_ID.fullmatch(run):
            continue
        try:
            stored = store.stat(keys.result_key(run)) is not None
        except (StorageError, OSError) as err:  # the next sweep asks again
            log.warning("sweep: cannot look up a result", extra=fields(run_id=run, error=str(err)))
            continue
        if stored:
            yield str(summary["Id"]), run


class Sweeper:
    """Sweeps now and every ``seconds`` on a thread of its own, until ``stop``."""

    def __init__(
        self, store: Store, listing: Listing, removal: Removal, seconds: float = SWEEP_SECONDS
    ) -> None:
        self._store = store
        self._listing = listing
        self._removal = removal
        self._periodic = Periodic("container-sweep", seconds, self.sweep, first_now=True)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        """End the sweeps; one under way finishes first."""
        self._periodic.stop()

    def sweep(self) -> int:
        """One sweep; the number of containers removed."""
        try:
            listed = list(self._listing())
        except Unavailable as err:  # the engine is down: the next sweep asks again
            log.warning("sweep: cannot list containers", extra=fields(error=str(err)))
            return 0
        removed = 0
        for container, run in finished(listed, self._store):
            if self._periodic.stopped.is_set():
                break
            removed += self._removal(container, run)
        level = logging.INFO if removed else logging.DEBUG
        log.log(level, "sweep done", extra=fields(listed=len(listed), removed=removed))
        return removed
