"""Runtimes run one ``Task`` (one resource script) somewhere and return its ``Outcome``.

    class Runtime(Protocol):
        def run(self, task: Task) -> Outcome      # blocks until the outcome is stored
        def start(self, task: Task, ended=None) -> None  # begin; the task replies itself (async)
        def stop(self, run: str, action: str) -> None  # stop what runs for it (a stop request)
        def tasks_waiting(self) -> int             # accepted, script not started yet
        def ready(self) -> None                    # Unavailable unless the engine/API answers
        def start_sweeps(self) -> None             # a serving process: remove leftovers, now and then
        def warm_counts(self) -> WarmCounts        # warm check containers (docs/warm-checks.md)
        def adopts(self, task: Task) -> bool       # another delivery's start of its run attaches
        def close(self) -> None                    # drain: wait for runs and their cleanup

Contract: ``run`` stores ``results/<run-id>.json`` and ``logs/<run-id>.log`` before it
returns, so a redelivered request finds them. A script that fails, a missing image or a
timeout is an ``Outcome`` with a failure; only infrastructure trouble raises
(``functions.errors.Unavailable``). A started task that holds a check lease (``task.lease``)
releases it once its outcome is recorded, or once it has ended without one
(``lease.release_held``). ``start`` calls ``ended(outcome)`` when it sees the task end (best
effort: a runtime closed meanwhile, or a Kubernetes task it stopped following, never calls
it). ``stop`` ends what runs for a run its sender stopped (``functions.ledger.tombstones`` has
marked it first): its Job, its container, the warm check under way on this replica; and each
runtime reads the mark just before it creates a Job or container and once more after, so a
stop that crosses a start still finds what it started (``RunStopped``). ``tasks_waiting`` counts the tasks queued or starting (``resource_function_tasks_waiting``).
``make_runtime`` is the one place that picks a runtime.

Packages: ``local/`` (Docker or Podman: only it and ``warm/engine.py`` import docker),
``kube/`` (Jobs; Kubernetes is reached through ``functions.kube``) and ``warm/`` (warm
checks, one path for both: the pool, the rule that sends a check there, ``warm.check.wanted``,
and each runtime's side, ``engine.py`` and ``pods.py``). Here, what both share: the async
runs (``background``: an asynchronous warm check runs in its request, ``InRequest``), the
labels and the bounded output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from functions.model import Outcome, Task
from functions.runtimes.background import Ended
from functions.runtimes.warm.pool import WarmCounts

if TYPE_CHECKING:
    from functions.settings import Settings
    from storage import Store


class Runtime(Protocol):
    def run(self, task: Task) -> Outcome: ...

    def start(self, task: Task, ended: Ended | None = None) -> None: ...

    def stop(self, run: str, action: str) -> None: ...

    def tasks_waiting(self) -> int: ...

    def ready(self) -> None: ...

    def start_sweeps(self) -> None: ...

    def warm_counts(self) -> WarmCounts: ...

    def adopts(self, task: Task) -> bool: ...

    def close(self) -> None: ...


def make_runtime(settings: Settings, store: Store) -> Runtime:
    if settings.runtime == "kubernetes":
        from functions.runtimes.kube.kubernetes import KubernetesRuntime

        return KubernetesRuntime.from_settings(settings, store)
    from functions.runtimes.local.container import ContainerRuntime

    return ContainerRuntime.from_settings(settings, store)
