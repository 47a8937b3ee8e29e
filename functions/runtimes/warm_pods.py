"""Warm check pods on Kubernetes (docs/warm-checks.md): the cluster's side of
``functions.runtimes.warm``, as ``warm_engine`` is the local engine's.

A warm pod lives in the task namespace (its NetworkPolicies, ServiceAccount, limits and quota
apply as to a task pod: ``warm_podspec.warm_pod_manifest``). Its resource container runs the
static pause program an init container copied from the project image; each check is a
``pods/exec`` of the check script with the request on the exec's stdin. Labels:
``warm-check`` (the key) and ``warm-owner`` (a hash of the replica's pod name): replicas never
share warm pods. A pod ends itself at its maximum age (``activeDeadlineSeconds``), also when
its replica is gone; the sweep at start deletes ended warm pods, and those of this replica's
name (a restarted container).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from functions.errors import Conflict, KubeApiError, NotFound, QuotaExceeded, Unavailable
from functions.kube.api import KubeApi
from functions.logs import fields
from functions.model import SCRIPTS, Task
from functions.phases import PhaseClock
from functions.runtimes.job_plan import JobPlan
from functions.runtimes.job_status import pod_verdict
from functions.runtimes.labels import MANAGED, WARM_POD_KEY_LABEL, WARM_POD_OWNER_LABEL
from functions.runtimes.output import Output
from functions.runtimes.warm import (
    QUOTA,
    CheckEnd,
    Gone,
    NotWarm,
    Warm,
    WarmSet,
    check_in_warm,
)
from functions.runtimes.warm_check import ImagePullFailed
from functions.runtimes.warm_podspec import owner_label, warm_pod_manifest
from functions.settings import WarmLimits

READY_POLL_SECONDS = 0.25
QUOTA_TRIES = 20  # creates of a warm pod while an evicted idle one frees the quota (0.25 s apart)
log = logging.getLogger("functions.kubernetes")


def replica_name() -> str:
    """This replica's name: its pod's (HOSTNAME), else the machine's."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


class WarmPods(WarmSet):
    """This replica's warm check pods: started, reused, expired, deleted."""

    def __init__(self, api: KubeApi, limits: WarmLimits, owner: str | None = None) -> None:
        super().__init__(limits, self._delete)
        self._api = api
        self._owner = owner or replica_name()

    def check(
        self, task: Task, plan: JobPlan, key: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        """Run the check in ``key``'s warm pod, started from ``plan`` if it has none
        (``warm.check_in_warm``). ``ImagePullFailed`` if its image cannot be had."""
        deadline = time.monotonic() + task.timeout_seconds
        return check_in_warm(
            self.pool,
            key,
            clock,
            start=lambda: self._start(task, plan, key, deadline),
            execute=lambda name: self._exec(name, task, keep, deadline),
            run=task.run_id,
        )

    def sweep(self) -> int:
        """Delete the warm pods that have ended, and this replica's (a restart's); how many."""
        try:
            pods, _ = self._api.list_pods(MANAGED)
        except (Unavailable, KubeApiError) as err:
            log.warning("warm sweep: cannot list pods", extra=fields(error=str(err)))
            return 0
        mine = owner_label(self._owner)
        removed = 0
        for pod in pods:
            metadata = pod.get("metadata") or {}
            labels = metadata.get("labels") or {}
            if WARM_POD_KEY_LABEL not in labels:
                continue
            ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if ended or labels.get(WARM_POD_OWNER_LABEL) == mine:
                self._delete(str(metadata.get("name")))
                removed += 1
        if removed:
            log.info("swept warm check pods", extra=fields(removed=removed))
        return removed

    def _start(self, task: Task, plan: JobPlan, key: str, deadline: float) -> Warm:
        """Create the warm pod, wait until its resource container runs, admit it."""
        manifest = warm_pod_manifest(plan, key, self._owner, self.pool.limits.max_age_seconds)
        name = manifest["metadata"]["name"]
        try:
            try:
                self._create(manifest)
            except Conflict:  # one of ours left from before (a restart): start afresh
                self._api.delete_pod(name)
                self._wait_gone(name, deadline)
                self._create(manifest)
            self._wait_running(name, deadline)
        except BaseException:
            self.pool.not_started(key)
            self._delete(name)
            raise
        warm = self.pool.admit(key, task.team, name)
        if warm is None:  # no room: this check only
            now = time.monotonic()
            warm = Warm(key=key, team=task.team, handle=name, started=now, used=now)
        return warm

    def _create(self, manifest: dict[str, Any]) -> None:
        """Create the warm pod. The task namespace's quota full: evict the least recently
        used idle warm pod (of any team) and try again while its removal frees the quota;
        none idle, or still full: ``NotWarm``, and the check runs in a Job (which waits for
        room, as every task does)."""
        evicted = False
        for _ in range(QUOTA_TRIES):
            try:
                self._api.create_pod(manifest)
                return
            except QuotaExceeded as err:
                full = err
            evicted = evicted or self.pool.evict_idle(QUOTA)
            if not evicted:
                break
            time.sleep(READY_POLL_SECONDS)
        raise NotWarm(f"no room for a warm pod: {full}")

    def _wait_running(self, name: str, deadline: float) -> None:
        while True:
            pod = self._api.read_pod(name)
            if pod is None:
                raise Unavailable(f"warm pod {name} vanished while starting")
            verdict = pod_verdict(pod, deadline_passed=False)
            if verdict is not None:
                if verdict.kind == "image_pull":
                    raise ImagePullFailed(verdict.message)
                raise Unavailable(f"warm pod {name} did not start: {verdict.message}")
            if _resource_running(pod):
                return
            if time.monotonic() >= deadline:
                raise Unavailable(f"warm pod {name} did not start within the check's budget")
            time.sleep(READY_POLL_SECONDS)

    def _wait_gone(self, name: str, deadline: float) -> None:
        while self._api.read_pod(name) is not None:
            if time.monotonic() >= deadline:
                raise Unavailable(f"warm pod {name} is still being deleted")
            time.sleep(READY_POLL_SECONDS)

    def _exec(self, name: str, task: Task, keep: int, deadline: float) -> CheckEnd:
        output = Output(keep)
        try:
            code = self._api.exec_in_pod(
                name, "resource", [SCRIPTS["check"]], task.stdin, output.add, deadline
            )
        except (NotFound, Conflict) as err:
            raise Gone() from err
        except (Unavailable, KubeApiError):
            if not self._running(name):
                raise Gone() from None
            raise
        if code != 0 and not self._running(name):
            raise Gone()  # ended under the check (deleted, its deadline): not the check's
        output.complete = True
        return code, output

    def _running(self, name: str) -> bool:
        pod = self._api.read_pod(name)
        return pod is not None and _resource_running(pod)

    def _delete(self, name: str) -> None:
        try:
            self._api.delete_pod(name)
        except (Unavailable, KubeApiError) as err:
            log.warning("cannot delete a warm pod", extra=fields(error=str(err)))


def _resource_running(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for container in status.get("containerStatuses") or []:
        if container.get("name") == "resource":
            return "running" in (container.get("state") or {})
    return False


@dataclass(frozen=True)
class PodCheck:
    """One check's ``warm_check.WarmExecutor`` on Kubernetes: ``pods`` run it in its key's warm
    pod, started from the check's ``plan`` if the key has none."""

    pods: WarmPods
    plan: JobPlan

    def image(self, task: Task, clock: PhaseClock) -> str:
        """The image reference as given: a digest if the type pins one (the cluster resolves
        a tag only when a pod starts)."""
        return task.resource_type.image

    def check(
        self, task: Task, key: str, image: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        return self.pods.check(task, self.plan, key, clock, keep)
