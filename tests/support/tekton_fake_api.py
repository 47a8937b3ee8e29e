"""The Kubernetes API as ``functions.kube.tekton_api.TektonApi`` offers it, in memory, for
the controller's shell in the fast tier: CustomRuns with resourceVersions (a stale write is a
``Conflict``, as the API server answers), a watch fed by every change, Events, Jobs deleted by
label, Leases. kmock's emulator does not serve custom resources' status here; the real API
server is the cluster tier's.

    api = FakeTektonApi(); api.create(customrun); api.fail_writes_of[name] = error
"""

from __future__ import annotations

import copy
import itertools
import queue
import threading
from collections.abc import Iterator
from typing import Any

from functions.errors import Conflict, NotFound


class FakeTektonApi:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, bool, str, str]] = []  # (name, warning, reason, message)
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.fail_writes_of: dict[str, Exception] = {}  # CustomRun name -> raised on write
        self.requests = 0  # as the controller's metric counts them

        self._versions = itertools.count(1)
        self._changes: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._lock = threading.Lock()

    # --- what the tests do --------------------------------------------------------------------

    def create(self, run: dict[str, Any]) -> dict[str, Any]:
        made = copy.deepcopy(run)
        with self._lock:
            made["metadata"]["resourceVersion"] = str(next(self._versions))
            made["metadata"].setdefault("uid", f"uid-{made['metadata']['name']}")
            self.runs[_key(made)] = made
        self._changes.put(("ADDED", copy.deepcopy(made)))
        return made

    def cancel(self, namespace: str, name: str) -> None:
        """As Tekton cancels a CustomRun: ``spec.status`` set to ``RunCancelled``."""
        with self._lock:
            live = self.runs[(namespace, name)]
            live["spec"]["status"] = "RunCancelled"
            live["metadata"]["resourceVersion"] = str(next(self._versions))
            changed = copy.deepcopy(live)
        self._changes.put(("MODIFIED", changed))

    def status_of(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.runs[(namespace, name)].get("status") or {})

    # --- TektonApi ----------------------------------------------------------------------------

    def list_customruns(self) -> tuple[list[dict[str, Any]], str]:
        self.requests += 1
        with self._lock:
            return [copy.deepcopy(r) for r in self.runs.values()], "0"

    def watch_customruns(
        self, resource_version: str, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        self.requests += 1
        while True:
            try:
                yield self._changes.get(timeout=min(seconds, 1))
            except queue.Empty:
                yield "BOOKMARK", {}

    def read_customrun(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests += 1
        with self._lock:
            found = self.runs.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def replace_status(self, run: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        name = run["metadata"]["name"]
        if name in self.fail_writes_of:
            raise self.fail_writes_of[name]
        with self._lock:
            live = self.runs.get(_key(run))
            if live is None:
                raise NotFound(name)
            if live["metadata"]["resourceVersion"] != run["metadata"]["resourceVersion"]:
                raise Conflict(f"customrun {name} changed")
            live["status"] = copy.deepcopy(status)
            live["metadata"]["resourceVersion"] = str(next(self._versions))
            written = copy.deepcopy(live)
        self._changes.put(("MODIFIED", copy.deepcopy(written)))
        return written

    def event(self, run: dict[str, Any], warning: bool, reason: str, message: str) -> None:
        self.requests += 1
        self.events.append((run["metadata"]["name"], warning, reason, message))

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.leases.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def write_lease(self, namespace: str, lease: dict[str, Any], create: bool) -> dict[str, Any]:
        key = (namespace, lease["metadata"]["name"])
        with self._lock:
            live = self.leases.get(key)
            if create and live is not None:
                raise Conflict("lease exists")
            if not create and (
                live is None
                or live["metadata"]["resourceVersion"] != lease["metadata"].get("resourceVersion")
            ):
                raise Conflict("lease changed")
            written = copy.deepcopy(lease)
            written["metadata"]["resourceVersion"] = str(next(self._versions))
            self.leases[key] = written
            return copy.deepcopy(written)


def _key(run: dict[str, Any]) -> tuple[str, str]:
    return (run["metadata"]["namespace"], run["metadata"]["name"])
