"""Launching a task Job (``functions.kube.api`` calls): the Job, or the one a previous delivery
of the request created (named from the run id), then its stdin Secret, owned by the Job
(``podspec``'s manifests, from the task's ``JobPlan``). A run its sender stopped gets neither;
a Job or Secret the API refuses as invalid is the request's failure (``rejected``).
"""

from __future__ import annotations

import time
from typing import Any

from functions import keys
from functions.errors import Conflict, NotFound, Rejected, RequestIdReused, RunStopped, Unavailable
from functions.kube.api import KubeApi, owner_uids, uid_of
from functions.ledger import tombstones
from functions.model import Outcome, Task
from functions.runtimes.kube import podspec
from functions.runtimes.kube.job_plan import JobPlan, KubernetesConfig
from functions.runtimes.kube.job_status import is_finished
from functions.runtimes.labels import JOB_RUN_LABEL, REQUEST_DIGEST_ANNOTATION
from functions.steps import stage_collect
from functions.steps.outcome import failed
from storage import Store

# A reply token outlives its Job's deadline by this: a pod may still be scheduled late.
REPLY_GRACE_SECONDS = 600


class JobLauncher:
    def __init__(self, api: KubeApi, store: Store, config: KubernetesConfig) -> None:
        self._api = api
        self._store = store
        self._config = config

    def launch(self, plan: JobPlan, task: Task) -> dict[str, Any]:
        """Create the Job, or attach to the one a previous delivery created; then its Secret
        (unless that Job has finished already: no credentials for a pod that will not run).
        A run stopped by its sender (``Runtime.stop``) gets neither; one stopped while its Job
        was created loses the Job before it gets the Secret its pod waits for."""
        self._not_stopped(plan)
        try:
            job = self._api.create_job(podspec.job_manifest(plan))
        except Conflict:
            job = self._existing_job(plan)
            if is_finished(job):
                return job
        except NotFound as err:
            raise Unavailable(f"cannot create Jobs in namespace {plan.namespace!r}: {err}") from err
        self._not_stopped(plan, created=True)
        self._create_secret(plan, task, job)
        return job

    def _not_stopped(self, plan: JobPlan, created: bool = False) -> None:
        if not tombstones.stopped(self._store, plan.run_id):
            return
        if created:
            self._api.delete_job(plan.job_name)
        raise RunStopped(f"run {plan.run_id} was stopped by its sender: its Job is not run")

    def rejected(self, task: Task, plan: JobPlan, err: Rejected) -> Outcome:
        """The API refused the Job or its Secret as invalid (per-type settings, a payload
        over the Secret size limit): a permanent failure of this request."""
        self._api.delete_job(plan.job_name)
        outcome = failed(task.action, "runtime", f"cannot start the task: {err}")
        return stage_collect.record_failure(self._store, task, outcome)

    def _existing_job(self, plan: JobPlan) -> dict[str, Any]:
        job = self._api.read_job(plan.job_name)
        if job is None:
            raise Unavailable(f"task Job {plan.job_name} vanished while attaching to it")
        metadata = job.get("metadata") or {}
        owner = (metadata.get("labels") or {}).get(JOB_RUN_LABEL)
        if owner != plan.run_id:
            raise Unavailable(f"Job {plan.job_name} exists but belongs to run {owner!r}")
        attached = (metadata.get("annotations") or {}).get(REQUEST_DIGEST_ANNOTATION, "")
        if attached not in ("", plan.request_digest):
            raise RequestIdReused()
        if metadata.get("deletionTimestamp"):  # deleted to run again (the store was down)
            raise Unavailable(f"task Job {plan.job_name} is being deleted: try again")
        return job

    def _create_secret(self, plan: JobPlan, task: Task, job: dict[str, Any]) -> None:
        uid = uid_of(job)
        if not uid:
            raise Unavailable(f"the Kubernetes API returned Job {plan.job_name} without a uid")
        token = (
            keys.reply_token(self._config.reply_secret, reply_claims(plan, time.time()))
            if plan.reply
            else ""
        )
        manifest = podspec.stdin_secret_manifest(
            plan,
            task.stdin,
            uid,
            task.secrets,
            token,
            resolved=task.resolved,
            name_files=self._config.name_files,
        )
        for attempt in range(2):
            try:
                self._api.create_secret(manifest)
                return
            except Conflict:
                existing = self._api.read_secret(plan.secret_name)
                if existing is not None and uid in owner_uids(existing):
                    return  # a previous delivery created it
                if attempt:
                    raise Unavailable(f"Secret {plan.secret_name} exists for another Job") from None
                # Left by an earlier Job of this name (deleted to run again): the garbage
                # collector would delete it under the new pod.
                self._api.delete_secret(plan.secret_name)
            except NotFound as err:
                raise Unavailable(f"cannot create Secret {plan.secret_name}: {err}") from err


def reply_claims(plan: JobPlan, now: float) -> keys.ReplyClaims:
    """What an asynchronous run's collect may post through the reply relay: its reply and (a
    check) its resource's discovered versions, for its request, until its Job's deadline."""
    assert plan.reply is not None
    deadline = now + plan.active_deadline_seconds + REPLY_GRACE_SECONDS
    return keys.ReplyClaims(
        run=plan.run_id,
        action=plan.action,
        request_id=plan.reply.request_id,
        subject=plan.reply.subject or "",
        team=plan.reply.team,
        resource=plan.history.resource_key if plan.history else "",
        expires=int(deadline),
    )
