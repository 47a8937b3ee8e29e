"""The Kubernetes API as ``functions.kube.tekton_api.TektonApi`` offers it, in memory, for
the controller's shell in the fast tier (and the Resources' scheduler's: any custom object): CustomRuns with resourceVersions (a stale write is a
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
from functions.kube.objects import Decoded, ListEnd, Undecodable
from functions.tekton.params import API_VERSION


class FakeTektonApi:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, bool, str, str]] = []  # (name, warning, reason, message)
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.fail_writes_of: dict[str, Exception] = {}  # CustomRun name -> raised on write
        self.requests = 0  # as the controller's metric counts them
        self.undecodable: dict[tuple[str, str], Undecodable] = {}  # listed, watched, read so
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []  # (ns, name, status)

        self._versions = itertools.count(1)
        self._changes: queue.Queue[tuple[str, Decoded]] = queue.Queue()
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

    def poison(self, namespace: str, name: str, limit: str = "depth") -> Undecodable:
        """A CustomRun of this project that the API serves but the controller cannot decode
        (``limit``: past which bound), as ``objects`` reports one."""
        with self._lock:
            version = str(next(self._versions))
        marks = {
            "metadata.namespace": namespace,
            "metadata.name": name,
            "metadata.uid": f"uid-{name}",
            "metadata.resourceVersion": version,
            "spec.customRef.apiVersion": API_VERSION,
        }
        found = Undecodable(f"past the {limit} bound", limit, marks)
        with self._lock:
            self.undecodable[(namespace, name)] = found
        self._changes.put(("ADDED", found))
        return found

    def changed(self, kind: str, obj: Decoded) -> None:
        """A watch event, as the API server sends one again after a reconnect."""
        self._changes.put((kind, obj))

    def cancel(self, namespace: str, name: str) -> None:
        """As Tekton cancels a CustomRun: ``spec.status`` set to ``RunCancelled``."""
        with self._lock:
            live = self.runs[(namespace, name)]
            live["spec"]["status"] = "RunCancelled"
            live["metadata"]["resourceVersion"] = str(next(self._versions))
            changed = copy.deepcopy(live)
        self._changes.put(("MODIFIED", changed))

    def edit(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """As a user's ``kubectl patch``: ``spec`` merged into the object's spec."""
        with self._lock:
            live = self.runs[(namespace, name)]
            live["spec"].update(spec)
            live["metadata"]["resourceVersion"] = str(next(self._versions))
            live["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
            changed = copy.deepcopy(live)
        self._changes.put(("MODIFIED", changed))

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            gone = self.runs.pop((namespace, name))
        self._changes.put(("DELETED", gone))

    def status_of(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.runs[(namespace, name)].get("status") or {})

    # --- TektonApi ----------------------------------------------------------------------------

    def list_customruns(self) -> Iterator[Decoded | ListEnd]:
        self.requests += 1
        with self._lock:
            listed: list[Decoded] = [copy.deepcopy(r) for r in self.runs.values()]
            listed += self.undecodable.values()
        yield from listed
        yield ListEnd("0", "")

    def watch_customruns(
        self, resource_version: str, seconds: int
    ) -> Iterator[tuple[str, Decoded]]:
        self.requests += 1
        while True:
            try:
                yield self._changes.get(timeout=min(seconds, 1))
            except queue.Empty:
                yield "BOOKMARK", {}

    def read_customrun(self, namespace: str, name: str) -> Decoded | None:
        self.requests += 1
        with self._lock:
            if (namespace, name) in self.undecodable:
                return self.undecodable[(namespace, name)]
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

    # ``custom_objects.CustomObjects``' names: the scheduler's Resources live here alike
    def list(self) -> Iterator[Decoded | ListEnd]:
        return self.list_customruns()

    def watch(self, resource_version: str, seconds: int) -> Iterator[tuple[str, Decoded]]:
        return self.watch_customruns(resource_version, seconds)

    def read(self, namespace: str, name: str) -> Decoded | None:
        return self.read_customrun(namespace, name)

    def patch_status(self, run: dict[str, Any], status: dict[str, Any]) -> None:
        self.requests += 1
        meta = run["metadata"]
        self.status_patches.append((meta["namespace"], meta["name"], copy.deepcopy(status)))

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
