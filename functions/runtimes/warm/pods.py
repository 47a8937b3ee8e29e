"""Warm check pods on Kubernetes (docs/warm-checks.md): the cluster's side of
``functions.runtimes.warm``, as ``engine`` is the local engine's.

A warm pod lives in the task namespace (its NetworkPolicies, ServiceAccount, limits and quota
apply as to a task pod: ``pod_manifest.warm_pod_manifest``). Its resource container runs
``rf-agent serve`` under the static pause program, both copied from the project image by an
init container. Each check goes to the agent over the pod network (``agent.AgentCall``): no
API request per check, only for a pod's start (create it, its token's Secret, and look until
it is Ready) and end. A pod's token is an HMAC of its name under ``CACHE_SECRET``, in a Secret
the pod owns (deleted with it); the NetworkPolicy ``warm-pods-from-check`` admits only the
check function's pods to the agent's port. Labels: ``warm-check`` (the pool key) and
``warm-owner`` (a hash of the replica's pod name): replicas never share warm pods. A pod ends
itself at its maximum age (``activeDeadlineSeconds``), also when its replica is gone; the
sweep at start deletes ended warm pods, and those of this replica's name (a restarted
container).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import requests

from functions.errors import KubeApiError, QuotaExceeded, Unavailable
from functions.kube.api import KubeApi
from functions.logs import fields
from functions.model import Task
from functions.phases import PhaseClock
from functions.runtimes.kube.job_plan import JobPlan
from functions.runtimes.kube.job_status import pod_verdict
from functions.runtimes.labels import MANAGED, WARM_POD_KEY_LABEL, WARM_POD_OWNER_LABEL
from functions.runtimes.output import Output
from functions.runtimes.warm.agent import AgentCall, pod_token
from functions.runtimes.warm.check import CheckEnd, ImagePullFailed, check_in_warm
from functions.runtimes.warm.lifecycle import WarmSet
from functions.runtimes.warm.pod_manifest import owner_label, token_secret, warm_pod_manifest
from functions.runtimes.warm.pool import QUOTA, NotWarm, Slot, Warm
from functions.settings import WarmLimits

READY_POLL_SECONDS = 0.25
QUOTA_TRIES = 20  # creates of a warm pod while an evicted idle one frees the quota (0.25 s apart)
log = logging.getLogger("functions.kubernetes")


def replica_name() -> str:
    """This replica's name: its pod's (HOSTNAME), else the machine's."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


class WarmPods(WarmSet):
    """This replica's warm check pods: started, reused, expired, deleted."""

    def __init__(
        self, api: KubeApi, limits: WarmLimits, secret: bytes, owner: str | None = None
    ) -> None:
        super().__init__(limits, self._delete_pod)
        self._api = api
        self._secret = secret
        self._owner = owner or replica_name()
        self._session = requests.Session()  # keep-alive to each pod's agent
        adapter = requests.adapters.HTTPAdapter(pool_connections=64, pool_maxsize=64)
        self._session.mount("http://", adapter)

    def check(
        self, task: Task, plan: JobPlan, key: str, source: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        """Run the check of ``source`` in one of ``key``'s warm pods, one started from
        ``plan`` if none has room (``warm.check.check_in_warm``). ``ImagePullFailed`` if its
        image cannot be had."""
        deadline = time.monotonic() + task.timeout_seconds
        wait = self.pool.limits.wait_seconds
        return check_in_warm(
            self.pool,
            lambda: self.pool.take(key, task.team, source, task.run_id, wait),
            clock,
            start=lambda slot: self._start(plan, slot, deadline),
            execute=lambda slot: self._call(slot, task, keep, deadline),
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
                self._delete_pod(str(metadata.get("name")))
                removed += 1
        if removed:
            log.info("swept warm check pods", extra=fields(removed=removed))
        return removed

    def _start(self, plan: JobPlan, slot: Slot, deadline: float) -> Warm:
        """Create a warm pod for ``slot``'s key and its token's Secret, wait until its agent
        is Ready, admit it."""
        limits = self.pool.limits
        manifest = warm_pod_manifest(plan, slot.key, self._owner, limits)
        name = manifest["metadata"]["name"]
        try:
            created = self._create(manifest)
            token = pod_token(self._secret, name)
            self._api.create_secret(token_secret(name, created["metadata"]["uid"], plan, token))
            address = self._wait_ready(name, deadline)
        except BaseException:
            self._delete_pod(name)
            raise
        return self.pool.admit(slot, name, address)

    def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the warm pod. The task namespace's quota full: evict the least recently
        used idle warm pod (of any team) and try again while its removal frees the quota;
        none idle, or still full: ``NotWarm``, and the check runs in a Job (which waits for
        room, as every task does)."""
        evicted = False
        for _ in range(QUOTA_TRIES):
            try:
                return self._api.create_pod(manifest)
            except QuotaExceeded as err:
                full = err
            evicted = evicted or self.pool.evict_idle(QUOTA)
            if not evicted:
                break
            time.sleep(READY_POLL_SECONDS)
        raise NotWarm(f"no room for a warm pod: {full}")

    def _wait_ready(self, name: str, deadline: float) -> str:
        """Until the pod's agent is Ready; its address (the pod's IP)."""
        while True:
            pod = self._api.read_pod(name)
            if pod is None:
                raise Unavailable(f"warm pod {name} vanished while starting")
            verdict = pod_verdict(pod, deadline_passed=False)
            if verdict is not None:
                if verdict.kind == "image_pull":
                    raise ImagePullFailed(verdict.message)
                raise Unavailable(f"warm pod {name} did not start: {verdict.message}")
            address = _ready_address(pod)
            if address:
                return address
            if time.monotonic() >= deadline:
                raise Unavailable(f"warm pod {name} did not start within the check's budget")
            time.sleep(READY_POLL_SECONDS)

    def _call(self, slot: Slot, task: Task, keep: int, deadline: float) -> CheckEnd:
        """The check through the pod's agent, over the pod network."""
        assert slot.warm is not None
        warm = slot.warm
        call = AgentCall(self._session, warm.address, pod_token(self._secret, warm.handle))
        slot.cancel = call.cancel
        output = Output(keep)
        try:
            code = call.run(slot.source, task.stdin, max(deadline - time.monotonic(), 1.0), output)
        finally:
            slot.cancel = None
        return code, output

    def _delete_pod(self, name: str) -> None:
        """Delete a warm pod (its token's Secret goes with it: the pod owns it)."""
        try:
            self._api.delete_pod(name)
        except (Unavailable, KubeApiError) as err:
            log.warning("cannot delete a warm pod", extra=fields(error=str(err)))


def _ready_address(pod: dict[str, Any]) -> str:
    """The pod's IP once it runs, is not going and its agent is Ready; else ""."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    ready = any(
        c.get("name") == "resource" and c.get("ready")
        for c in status.get("containerStatuses") or []
    )
    return str(status.get("podIP") or "") if ready else ""


@dataclass(frozen=True)
class PodCheck:
    """One check's ``warm.check.WarmExecutor`` on Kubernetes: ``pods`` run it in one of its
    key's warm pods, started from the check's ``plan`` if none has room."""

    pods: WarmPods
    plan: JobPlan

    def image(self, task: Task, clock: PhaseClock) -> str:
        """The image reference as given: a digest if the type pins one (the cluster resolves
        a tag only when a pod starts)."""
        return task.resource_type.image

    def check(
        self, task: Task, key: str, source: str, image: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        return self.pods.check(task, self.plan, key, source, clock, keep)
