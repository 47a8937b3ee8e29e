"""One warm check, the same on both runtimes (docs/warm-checks.md): which checks go to a warm
container, the key of the one that serves them, and the check's end turned into its run's
``Outcome``. A runtime gives only its ``WarmExecutor``: how the key names the check's image,
and how the check runs in the key's warm container (``warm_engine``) or pod (``warm_pods``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from functions.keys import canonical_json
from functions.model import Outcome, ResourceType, Task
from functions.phases import PhaseClock
from functions.redaction import Redactor
from functions.runtimes.warm import CheckEnd
from functions.steps import stage_collect
from functions.steps.outcome import failed, final_failure
from storage import Store
from storage.archive import ArchiveOptions
from storage.store_errors import StorageError


class ImagePullFailed(Exception):
    """The check's image cannot be had (the registry refused it, or the cluster could not
    pull it): the request's ``image_pull`` failure. Trouble that may pass is ``Unavailable``."""


class WarmExecutor(Protocol):
    """A runtime's part of a warm check."""

    def image(self, task: Task, clock: PhaseClock) -> str:
        """The check's image as its key holds it; ``ImagePullFailed`` if it cannot be had."""
        ...

    def check(
        self, task: Task, key: str, image: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        """Run the check in ``key``'s warm container, started from ``image`` if it has none
        (``warm.check_in_warm``); None if that one is busy or none could be started.
        ``keep``: the bytes of stderr's tail to keep (``stage_collect.stderr_bytes``)."""
        ...


def wanted(warm: object | None, task: Task) -> bool:
    """Whether ``task`` goes to a warm container: a check with a version history (whose
    resource key the warm key holds), on a runtime keeping warm ones (``warm``: not None)."""
    return warm is not None and task.action == "check" and task.history is not None


def warm_key(*, team: str, image_digest: str, resource_key: str, settings: ResourceType) -> str:
    """The key of a check's warm container (32 hex chars): a hash of its team, the image's
    digest, the resource key (``keys.resource_key``, an HMAC of the resolved source) and what
    the type's settings make of the container (``container_settings``): two types of one
    image that differ in those never share one."""
    shape = container_settings(settings)
    message = canonical_json(["warm-check", team, image_digest, resource_key, shape])
    return hashlib.sha256(message).hexdigest()[:32]


def container_settings(resource_type: ResourceType) -> dict[str, Any]:
    """The type's settings that shape a warm container or pod (privileges, resources,
    placement, pull secrets); not the image (keyed apart) nor the check's own budget."""
    return {
        "privileged": resource_type.privileged,
        "resources": resource_type.resources,
        "node_selector": resource_type.node_selector,
        "tolerations": resource_type.tolerations,
        "image_pull_secrets": resource_type.image_pull_secrets,
    }


def run_warm_check(store: Store, task: Task, executor: WarmExecutor) -> Outcome | None:
    """``task`` (a check ``wanted`` sends warm) run by ``executor`` in its warm container or
    pod and collected as any run's output (``stage_collect.collect_task``: the limits,
    redaction, log and result record); None if that one is busy or none could be started
    (the runtime runs the check as any task then). An image that cannot be had is a recorded
    ``image_pull`` failure; a permanent store refusal the request's failure."""
    assert task.history is not None
    clock = PhaseClock()
    redactor = Redactor(task.secrets)
    try:
        try:
            image = executor.image(task, clock)
            key = warm_key(
                team=task.team,
                image_digest=image,
                resource_key=task.history.resource_key,
                settings=task.resource_type,
            )
            ended = executor.check(task, key, image, clock, stage_collect.stderr_bytes(redactor))
        except ImagePullFailed as err:
            pulled = failed("check", "image_pull", str(err))
            return clock.attach(stage_collect.record_failure(store, task, pulled))
        if ended is None:
            return None
        code, output = ended
        outcome = stage_collect.collect_task(
            store,
            task,
            ArchiveOptions(),  # a check packs nothing
            exit_code=code,
            stdout=output.stdout,
            stderr=output.stderr,
            redactor=redactor,
            clock=clock,
        )
    except StorageError as err:  # a permanent store refusal; retryable ones raise here
        outcome = stage_collect.record_failure(store, task, final_failure(task.action, err))
    return clock.attach(outcome)
