"""The kubernetes runtime: one Job per task (API calls through ``functions.kube.api``).

``run`` launches the Job (``job_launch``: named from the run id, so a redelivered request
finds it and waits on it instead of starting another; then the stdin Secret owned by the
Job), then follows the Job's pod until a verdict (``job_status.judge``), as one watch of the task pods shared by every
run of the runtime sees it (``pod_watch``): fails fast on image-pull errors, deletes the Job on
timeout, reads ``results/<run-id>.json`` that ``collect`` stored on completion.
Failures that only the function sees (image pull, timeout, a failed or vanished Job) are
recorded with ``results.record_outcome`` so a redelivery replays them. A step that could not
reach the store is not a failure of the request: the Job and its Secret are deleted, nothing
is recorded and ``TaskUnavailable`` (an ``Unavailable``: HTTP 503) makes Knative
redeliver, which starts a new Job. ``start`` creates the Job with reply-to-sink arguments and
returns at once; ``collect`` posts the reply, and a best-effort background follower posts
the failures ``collect`` never saw (for asynchronous requests a store outage inside the task
cannot be redelivered after the 202: a ``storage`` failure is posted, and nothing recorded).

API errors arrive translated by ``functions.kube.api``: ``Unavailable`` for anything worth retrying,
a ``KubeApiError`` (``NotFound``/``Conflict``/``Gone``, ``Rejected``: an invalid request)
otherwise; ``functions.steps.outcome.final_failure`` decides what a store error means.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from functions.errors import KubeApiError, Rejected, Unavailable, failure_kind
from functions.kube.api import KubeApi, api_client_from_env, uid_of
from functions.ledger import results
from functions.logs import fields
from functions.model import FailureKind, Outcome, Task
from functions.phases import PhaseClock, timed
from functions.runtimes.background import (
    AsyncEnd,
    BackgroundRuns,
    Ended,
    InRequest,
    end_async_run,
)
from functions.runtimes.kube.job_launch import JobLauncher
from functions.runtimes.kube.job_plan import (
    JobPlan,
    KubernetesConfig,
    job_name,
    plan_for,
    secret_name,
)
from functions.runtimes.kube.job_status import (
    Verdict,
    judge,
    pod_phases,
    pod_started,
    started_at,
)
from functions.runtimes.kube.pod_watch import Pods, PodWatch
from functions.runtimes.labels import MANAGED
from functions.runtimes.warm.check import adoptable, run_warm_check, wanted
from functions.runtimes.warm.pods import PodCheck, WarmPods
from functions.runtimes.warm.pool import WarmCounts
from functions.steps.outcome import failed, final_failure, task_deadline
from storage import Store
from storage.store_errors import StorageError

if TYPE_CHECKING:
    from functions.settings import Settings

log = logging.getLogger("functions.kubernetes")


class TaskUnavailable(Unavailable):
    """The task met trouble that may pass (a step could not reach the store, a registry
    answered 5xx or 429): its Job was deleted and nothing recorded, so a redelivered request
    starts the task again. ``failure_kind``: what it becomes after a 202, when nobody
    redelivers."""

    def __init__(self, message: str, failure_kind: FailureKind) -> None:
        super().__init__(message)
        self.failure_kind = failure_kind


class StoppedFollowing(Unavailable):
    """The runtime was closed while following a task: a synchronous request gets 503 (and
    is redelivered); an asynchronous task is left to ``collect``, which replies itself."""


@dataclass(frozen=True)
class Settled:
    outcome: Outcome
    by_collect: bool  # collect stored it (and, for async tasks, posted the reply)


class KubernetesRuntime:
    def __init__(self, api_client: Any, store: Store, config: KubernetesConfig) -> None:
        self._api = KubeApi(api_client, config.namespace, config.request_timeout)
        self._jobs = JobLauncher(self._api, store, config)
        self._store = store
        self._config = config
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._following: set[str] = set()
        self._waiting: set[str] = set()  # run ids whose Job's pod has not started
        self._background = BackgroundRuns("follow")
        self._in_request = InRequest()
        self._pods = PodWatch(self._api, MANAGED, config.watch_seconds)
        self._warm = (
            WarmPods(self._api, config.warm, config.reply_secret) if config.warm.enabled else None
        )

    @classmethod
    def from_settings(cls, settings: Settings, store: Store) -> KubernetesRuntime:
        config_ = KubernetesConfig.from_settings(settings)
        if config_.name_files is None:
            log.info(
                "task pods: stage and collect resolve names with the pod's own /etc/hosts and "
                "/etc/resolv.conf, which the resource step may rewrite (TASK_NAME_FILES=off, "
                "or the function does not run in the cluster)",
                extra=fields(task_name_files=settings.task_name_files),
            )
        return cls(api_client_from_env(settings.kubeconfig), store, config_)

    def start_sweeps(self) -> None:
        """Finished Jobs go by their ``ttlSecondsAfterFinished``; warm check pods that ended
        or were this replica's are deleted (``warm.pods``)."""
        if self._warm is not None:
            self._warm.start()

    def warm_counts(self) -> WarmCounts:
        return self._warm.counts() if self._warm is not None else WarmCounts()

    def adopts(self, task: Task) -> bool:
        return adoptable(self._warm, task)

    def close(self) -> None:
        """Stop following asynchronous tasks (``collect`` replies for them) and wait until
        the followers have ended (at most one watch request, ``watch_seconds``)."""
        self._closed.set()
        self._pods.close()
        self._background.close()
        if self._warm is not None:
            self._warm.close()  # after the background's Jobs; a warm check in its request is cut (503)
        self._api.close()

    def run(self, task: Task) -> Outcome:
        """Run the task's Job (or attach to it) and return its stored outcome. Its phases:
        ``launch`` (Job and Secret), ``pod`` (the pod from scheduling to its end, as seen
        here), ``result`` (reading what collect stored) and, inside ``pod``, those collect
        reported (``pod_contract.POD_PHASES``, on the node's clock)."""
        plan = plan_for(task, self._config, self._store.url, reply=False)
        if wanted(self._warm, task):
            warm = self._warm_check(task, plan)
            if warm is not None:
                return warm
        clock = PhaseClock()
        try:
            with clock.phase("launch"):
                job = self._jobs.launch(plan, task)
        except Rejected as err:
            return self._jobs.rejected(task, plan, err)
        return clock.attach(self._settle(task, plan, job, clock).outcome)

    def ready(self) -> None:
        """``Unavailable`` unless the Kubernetes API answers (a page of one Job)."""
        self._api.answers()

    def _warm_check(self, task: Task, plan: JobPlan) -> Outcome | None:
        """The check through a warm pod's agent (``warm.check``); None if it cannot go warm
        now (then a Job runs it)."""
        assert self._warm is not None
        return run_warm_check(self._store, task, PodCheck(self._warm, plan))

    def tasks_waiting(self) -> int:
        """Followed Jobs whose pod has not started (not created, not scheduled, pulling
        its first image). Asynchronous Jobs count while this replica follows them."""
        with self._lock:
            return len(self._waiting)

    def _pod_waits(self, run: str, waiting: bool) -> None:
        with self._lock:
            (self._waiting.add if waiting else self._waiting.discard)(run)

    def start(self, task: Task, ended: Ended | None = None) -> None:
        """Create the Job (idempotent) and return; the task posts its own reply. A check
        that goes warm runs in its request and posts its reply before the 202
        (``InRequest``: nothing else would owe it after a crash of this replica); one whose
        warm pod is busy gets its Job."""
        if wanted(self._warm, task):
            plan = plan_for(task, self._config, self._store.url, reply=False)
            sink = self._config.sink
            if self._in_request.run(
                self._store, sink, task, ended, lambda: self._warm_check(task, plan)
            ):
                return
        plan = plan_for(task, self._config, self._store.url, reply=True)
        clock = PhaseClock()
        try:
            with clock.phase("launch"):
                job = self._jobs.launch(plan, task)
        except Rejected as err:
            outcome = self._jobs.rejected(task, plan, err)
            end_async_run(self._store, self._config.sink, task, outcome, ended, AsyncEnd.IN_REQUEST)
            return
        with self._lock:
            if task.run_id in self._following:
                return
            self._following.add(task.run_id)
        self._background.submit(self._follow_and_reply, task, plan, job, ended, clock)

    def stop(self, run: str, action: str) -> None:
        """Delete the run's Job and Secret (its pod goes with them), and end its warm check
        if this replica runs one; a follower of the Job sees it gone."""
        if self._warm is not None:
            self._warm.stop(run)
        name = job_name(action, run)
        self._api.delete_job(name)
        self._api.delete_secret(secret_name(name))

    # --- following -----------------------------------------------------------------------

    def _settle(
        self, task: Task, plan: JobPlan, job: dict[str, Any], clock: PhaseClock | None = None
    ) -> Settled:
        try:
            with timed(clock, "pod"):
                verdict, pods = self._follow(plan, job)
            with timed(clock, "result"):
                settled = self._conclude(task, plan, verdict)
            inside = replace(
                settled.outcome, phases=(*settled.outcome.phases, *pod_phases(pods.values()))
            )
            settled = replace(settled, outcome=inside)
        except StorageError as err:
            settled = Settled(final_failure(task.action, err), by_collect=False)
        except KubeApiError as err:  # none expected while following
            raise Unavailable(f"Kubernetes API, following {plan.job_name}: {err}") from err
        finally:
            self._pod_waits(plan.run_id, False)
        self._drop_secret(plan)
        return settled

    def _follow(self, plan: JobPlan, job: dict[str, Any]) -> tuple[Verdict, Pods]:
        """Judge the Job and its pods, as the shared watch sees them, until a verdict (with
        the pods it was reached on). The
        Job is read again when a pod failed, went or vanished (then the Job's state decides),
        and when its pods have not changed for ``watch_seconds`` (a Job deleted or failed
        without a pod shows no pod event)."""
        budget_end = (started_at(job) or _now()).timestamp() + plan.active_deadline_seconds
        deadline = time.monotonic() + (
            budget_end - _now().timestamp() + self._config.deadline_slack_seconds
        )
        uid = uid_of(job)
        current: dict[str, Any] | None = job
        with self._pods.follow(plan.job_name) as following:
            while True:
                pods = following.pods(uid)
                passed = _now().timestamp() >= budget_end
                self._pod_waits(plan.run_id, not pod_started(pods.values()))
                verdict = judge(current, pods.values(), deadline_passed=passed)
                if verdict is None and time.monotonic() >= deadline:
                    verdict = Verdict("timeout")
                if verdict is not None:
                    return verdict, pods
                if self._closed.is_set():
                    raise StoppedFollowing("the runtime was closed while following a task")
                left = min(self._config.watch_seconds, deadline - time.monotonic())
                changed = following.wait(max(0.5, left))
                # Pods first, then the Job: the Job controller marks a Job failed (its
                # deadline) before it kills the pods, so a pod seen killed comes with the
                # Job's reason.
                if not changed or _ending(following.pods(uid), pods):
                    current = self._current_job(plan, uid)

    def _current_job(self, plan: JobPlan, uid: str) -> dict[str, Any] | None:
        current = self._api.read_job(plan.job_name)
        if current is not None and uid and uid_of(current) != uid:
            raise Unavailable(f"task Job {plan.job_name} was replaced while followed")
        return current

    def _conclude(self, task: Task, plan: JobPlan, verdict: Verdict) -> Settled:
        if verdict.kind == "unavailable":
            # Not the request's outcome: run it again on redelivery, from a new Job.
            self._api.delete_job(plan.job_name)
            self._api.delete_secret(plan.secret_name)
            raise TaskUnavailable(
                f"the task met trouble that may pass, its Job {plan.job_name} was deleted to "
                f"run again: {verdict.message}",
                verdict.failure,
            )
        if verdict.kind in ("complete", "gone"):
            wait = self._config.result_wait_seconds if verdict.kind == "complete" else 0
            stored = self._read_result(task, wait)
            if stored is not None:
                return Settled(stored, by_collect=True)
            if verdict.kind == "complete":
                verdict = Verdict("runtime", "the task Job completed but stored no result")
        outcome = results.record_outcome(
            self._store,
            task.run_id,
            self._failure(task, plan, verdict),
            request=task.request_digest,
        )
        if verdict.kind in ("image_pull", "timeout"):
            self._api.delete_job(plan.job_name)  # after recording: a redelivery replays it
        return Settled(outcome, by_collect=False)

    def _failure(self, task: Task, plan: JobPlan, verdict: Verdict) -> Outcome:
        if verdict.kind == "timeout":
            return task_deadline(
                task.action, plan.active_deadline_seconds, plan.timeout_seconds, plan.margin_seconds
            )
        return failed(task.action, verdict.failure, verdict.message, verdict.detail)

    def _read_result(self, task: Task, wait: float) -> Outcome | None:
        end = time.monotonic() + wait
        while True:
            outcome = results.read_outcome(self._store, task.run_id, request=task.request_digest)
            if outcome is not None or time.monotonic() >= end:
                return outcome
            time.sleep(0.2)

    def _drop_secret(self, plan: JobPlan) -> None:
        """The credentials are not needed once the task is decided (Kubernetes would delete
        them with the Job, after its TTL)."""
        try:
            self._api.delete_secret(plan.secret_name)
        except (Unavailable, Rejected) as err:
            log.warning(
                "cannot delete the stdin Secret",
                extra=fields(secret=plan.secret_name, error=str(err)),
            )

    def _follow_and_reply(
        self,
        task: Task,
        plan: JobPlan,
        job: dict[str, Any],
        ended: Ended | None,
        clock: PhaseClock,
    ) -> None:
        """Async tasks: post the failures collect never saw (best effort: the function may
        be scaled down before the task ends; collect replies for every task it finishes).
        The run's phases are ``run``'s (``pod``: from when this follower began)."""
        try:
            settled = self._settle(task, plan, job, clock)
        except StoppedFollowing:
            log.info(
                "stopped following an asynchronous task at close; collect replies",
                extra=fields(run_id=task.run_id, job=plan.job_name),
            )
        except TaskUnavailable as err:
            # Answered 202 already, so Knative will not redeliver: tell the requester. Nothing
            # is recorded, so sending the same request again runs it afresh.
            log.error(
                "an asynchronous task could not reach the store; its Job was deleted",
                extra=fields(run_id=task.run_id, job=plan.job_name, error=str(err)),
            )
            outcome = failed(task.action, failure_kind(err), str(err))
            end_async_run(self._store, self._config.sink, task, outcome, ended)
        except Exception as err:  # the task may still run: its lease is left to collect
            log.exception(
                "following an asynchronous task failed",
                extra=fields(run_id=task.run_id, job=plan.job_name),
            )
            outcome = failed(task.action, "runtime", f"following the task failed: {err}")
            end_async_run(
                self._store, self._config.sink, task, outcome, ended, AsyncEnd.MAY_STILL_RUN
            )
        else:
            # The task has ended: collect let go of an async check's lease if it ran (this
            # is then one read) and replied; else the failure is recorded here, or nothing
            # if the store is down (a waiter then runs the check).
            outcome = clock.attach(settled.outcome)
            how = AsyncEnd.COLLECT_REPLIED if settled.by_collect else AsyncEnd.ENDED
            end_async_run(self._store, self._config.sink, task, outcome, ended, how)
        finally:
            with self._lock:
                self._following.discard(task.run_id)


def _ending(pods: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> bool:
    """A pod failed, is going or vanished (e.g. the Job's deadline passed while an init
    container ran, so it never turns Failed): the Job's state decides."""
    if set(before) - set(pods):
        return True
    return any(
        _phase(pod) == "Failed" or (pod.get("metadata") or {}).get("deletionTimestamp")
        for pod in pods.values()
    )


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _now() -> datetime:
    return datetime.now(UTC)
