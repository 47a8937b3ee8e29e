"""What a task Job's state means, read from Job and Pod objects as plain dicts (pure).

``judge`` turns the latest Job and its pods into a ``Verdict`` once the task is decided:

    complete    the Job completed (or its pod succeeded): collect stored the result
    image_pull  a container cannot start (an unknown or refused image, a bad name, missing
                config): fail fast
    timeout     the Job ran out of time (DeadlineExceeded)
    unavailable not the request's fault, and it may succeed later: stage or collect reported a
                retryable ``StepFailure`` (the store), or a registry answered a pull with
                5xx or 429 or did not answer (``errors.pull_is_transient``, the rule the
                container runtime follows too). The function deletes the Job, records
                nothing and answers 503 (a redelivery runs it anew)
    runtime     the Job failed otherwise (a step's permanent failure, with its kind; the pod
                was killed)
    gone        the Job no longer exists (deleted by someone, or by its TTL)

``None`` means "still running: keep watching".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from functions.errors import pull_is_transient
from functions.model import FailureKind, Phase
from functions.steps.pod_contract import StepFailure, StepTimings

PULL_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
    }
)
STEP_CONTAINERS = ("stage", "collect")  # ours: their termination messages are safe to show


@dataclass(frozen=True)
class Verdict:
    kind: str  # complete | image_pull | timeout | unavailable | runtime | gone
    message: str = ""
    detail: str = ""  # a step's own words, for the failure's log tail
    failure: FailureKind = "runtime"  # the reply's kind for it (a step's own, image_pull)


def judge(
    job: dict[str, Any] | None, pods: Iterable[dict[str, Any]], *, deadline_passed: bool
) -> Verdict | None:
    """The verdict on a task, or None while it runs. ``deadline_passed``: the Job's
    activeDeadlineSeconds has elapsed (a pod killed then failed of the timeout)."""
    pods = list(pods)
    if job is None:
        step = _failed_step(pods)
        if step is not None and step.kind == "unavailable":
            return step  # deleted to run again, by another delivery that followed it too
        return Verdict("gone", "the task Job was deleted before it finished")
    verdict = job_verdict(job, pods)
    if verdict is not None:
        return verdict
    for pod in pods:
        verdict = pod_verdict(pod, deadline_passed=deadline_passed)
        if verdict is not None:
            return verdict
    return None


def job_verdict(job: dict[str, Any], pods: list[dict[str, Any]]) -> Verdict | None:
    conditions = {c.get("type"): c for c in _conditions(job) if c.get("status") == "True"}
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return Verdict("complete")
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is None:
        return None
    reason = failed.get("reason") or "Failed"
    if reason == "DeadlineExceeded":
        return Verdict("timeout")
    step = _failed_step(pods)
    message = f"the task Job failed ({reason}: {failed.get('message') or 'no message'})"
    if step is not None:
        return Verdict(step.kind, f"{message}; {step.message}", step.detail, step.failure)
    return Verdict("runtime", message)


def pod_verdict(pod: dict[str, Any], *, deadline_passed: bool) -> Verdict | None:
    status = pod.get("status") or {}
    for container in _container_statuses(status):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_FAILURES:
            message = _pull_message(container, waiting)
            transient = pull_is_transient(waiting.get("message") or "")
            return Verdict("unavailable" if transient else "image_pull", message, "", "image_pull")
    phase = status.get("phase")
    if phase == "Succeeded":
        return Verdict("complete")
    if phase == "Failed":
        if deadline_passed or status.get("reason") == "DeadlineExceeded":
            return Verdict("timeout")
        step = _failed_step([pod])
        return step or Verdict(
            "runtime",
            f"the task pod failed: {status.get('reason') or ''}"
            f" {status.get('message') or ''}".rstrip(),
        )
    return None


def started_at(job: dict[str, Any]) -> datetime | None:
    """When the Job's deadline started counting (status.startTime, else creation)."""
    stamp = (job.get("status") or {}).get("startTime") or (job.get("metadata") or {}).get(
        "creationTimestamp"
    )
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def pod_started(pods: Iterable[dict[str, Any]]) -> bool:
    """Whether a task's pod has started work: one of its containers runs or has run. Until
    then the Job waits for a pod (not created, not scheduled, pulling its first image)."""
    return any(
        {"running", "terminated"} & set((container.get("state") or {}).keys())
        for pod in pods
        for container in _container_statuses(pod.get("status") or {})
    )


def pod_phases(pods: Iterable[dict[str, Any]]) -> tuple[Phase, ...]:
    """Where the task's pod spent its time, as its collect step reported on success
    (``StepTimings``); none if it did not."""
    for pod in pods:
        for container in _container_statuses(pod.get("status") or {}):
            ended = (container.get("state") or {}).get("terminated") or {}
            if container.get("name") == "collect" and ended.get("exitCode") == 0:
                timings = StepTimings.parse(ended.get("message") or "")
                if timings is not None:
                    return timings.phases
    return ()


def is_finished(job: dict[str, Any]) -> bool:
    return job_verdict(job, []) is not None


def _conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list((job.get("status") or {}).get("conditions") or [])


def _container_statuses(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _pull_message(container: dict[str, Any], waiting: dict[str, Any]) -> str:
    image = container.get("image") or "?"
    text = waiting.get("message") or "no details"
    return (
        f"container {container.get('name')!r} cannot start image {image}: "
        f"{waiting.get('reason')}: {text}"
    )


def _failed_step(pods: list[dict[str, Any]]) -> Verdict | None:
    """The first container that terminated unsuccessfully, as a runtime (or unavailable)
    verdict."""
    for pod in pods:
        for container in _container_statuses(pod.get("status") or {}):
            ended = (container.get("state") or {}).get("terminated") or {}
            if ended and ended.get("exitCode", 0) != 0:
                return _step_failure(container.get("name") or "?", ended)
    return None


def _step_failure(name: str, ended: dict[str, Any]) -> Verdict:
    why = ended.get("reason") or "Error"
    message = f"step {name!r} exited with code {ended.get('exitCode')} ({why})"
    # A resource image may write anything into its termination message: read only ours.
    reported = StepFailure.parse(ended.get("message") or "") if name in STEP_CONTAINERS else None
    if reported is None:
        return Verdict("runtime", message)
    last = reported.message.strip().splitlines()[-1:]
    return Verdict(
        "unavailable" if reported.retryable else "runtime",
        f"{message}: {last[0]}" if last else message,
        reported.message,
        reported.kind,
    )
