"""One warm check, the same on both runtimes (docs/warm-checks.md): which checks go warm, the
pool key of the container that serves them and the source's directory in it, the check in
it (``check_in_warm``) and its end turned into its run's ``Outcome``. A runtime gives only its
``WarmExecutor``: how the key names the check's image, and how a check runs in the key's warm
container (``engine``) or pod (``pods``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from functions.errors import RunStopped, Unavailable
from functions.keys import canonical_json
from functions.model import Outcome, ResourceType, Task
from functions.phases import PhaseClock
from functions.redaction import Redactor
from functions.runtimes.output import Output
from functions.runtimes.warm.pool import (
    DEAD,
    Busy,
    Gone,
    NoRoom,
    NotWarm,
    Slot,
    Warm,
    WarmPool,
)
from functions.steps import stage_collect
from functions.steps.outcome import failed, final_failure
from storage import Store
from storage.archive import ArchiveOptions
from storage.store_errors import StorageError

# A check's end in a warm container: its exit code (None: over its budget) and its output.
CheckEnd = tuple[int | None, Output]
log = logging.getLogger("functions.runtimes")


class ImagePullFailed(Exception):
    """The check's image cannot be had (the registry refused it, or the cluster could not
    pull it): the request's ``image_pull`` failure. Trouble that may pass is ``Unavailable``."""


class WarmExecutor(Protocol):
    """A runtime's part of a warm check."""

    def image(self, task: Task, clock: PhaseClock) -> str:
        """The check's image as its key holds it; ``ImagePullFailed`` if it cannot be had."""
        ...

    def check(
        self, task: Task, key: str, source: str, image: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        """Run the check of ``source`` in one of ``key``'s warm containers, one started from
        ``image`` if none has room (``check_in_warm``); None if it cannot go warm now.
        ``keep``: the bytes of stderr's tail to keep (``stage_collect.stderr_bytes``)."""
        ...


def wanted(warm: object | None, task: Task) -> bool:
    """Whether ``task`` goes to a warm container: a check with a version history (whose
    resource key names its directory), on a runtime keeping warm ones (``warm``: not None)."""
    return warm is not None and task.action == "check" and task.history is not None


def adoptable(warm: object | None, task: Task) -> bool:
    """Whether a second start of ``task``'s run, another delivery's on any replica, finds the
    first (its Job or container is named after the run): not for a warm check, which runs in
    its request on one replica and would run again (``Runtime.adopts``)."""
    return not wanted(warm, task)


def pool_key(*, team: str, image_digest: str, settings: ResourceType) -> str:
    """The key of the warm containers a check may run in (32 hex chars): a hash of its team,
    the image's digest and what the type's settings make of the container
    (``container_settings``). Sources of one team and one image share them: that image
    already gets each of those sources' credentials on its stdin. Two teams, two images, or
    two types of one image whose settings differ never do."""
    shape = container_settings(settings)
    message = canonical_json(["warm-pool", team, image_digest, shape])
    return hashlib.sha256(message).hexdigest()[:32]


def source_dir(resource_key: str) -> str:
    """The name of a source's directory in a warm container (32 hex chars): a hash of its
    resource key (``keys.resource_key``, itself an HMAC of the image and the resolved source),
    so that a name gives nothing of the source away."""
    return hashlib.sha256(f"warm-source:{resource_key}".encode()).hexdigest()[:32]


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


def check_in_warm(
    pool: WarmPool,
    slot_for: Callable[[], Slot],
    clock: PhaseClock,
    start: Callable[[Slot], Warm],
    execute: Callable[[Slot], CheckEnd],
) -> CheckEnd | None:
    """Run a check in the warm container ``slot_for`` gives it, or in one ``start`` starts
    for its slot (and ``admit``s: ``not_started`` is called here if it raises);
    ``execute(slot)`` runs it there. None when it cannot go warm
    (its source busy, no room within the wait, none could be started): run it without
    reuse. A container found ``Gone`` is evicted and the check runs once more elsewhere if
    that one had served checks before (a new one gone is ``Unavailable``). A check whose
    sender stopped it raises ``RunStopped``: it is not run again."""
    for _ in range(2):
        try:
            slot = slot_for()
        except (Busy, NoRoom) as err:
            log.info("the check runs without reuse: %s", err)
            return None
        if slot.warm is None:
            try:
                with clock.phase("create"):
                    start(slot)
            except NotWarm as err:
                pool.not_started(slot)
                log.warning("no warm check container, the check runs in a new one: %s", err)
                return None
            except BaseException:
                pool.not_started(slot)
                raise
        warm = slot.warm
        assert warm is not None
        if slot.stopped:  # stopped while it waited for room or for its container to start
            pool.back(slot)
            raise RunStopped(f"run {slot.run} was stopped by its sender")
        gone = False
        try:
            with clock.phase("script"):
                ended = execute(slot)
        except (Busy, NoRoom) as err:  # the agent turned it away for now: elsewhere, whole
            log.info("the check runs without reuse: %s", err)
            return None
        except Gone:
            pool.evict(warm, DEAD)  # before it goes back: never handed out again
            gone = True
        except BaseException:
            pool.evict(warm, DEAD)  # in a state unknown: not reused
            raise
        finally:
            pool.back(slot)
        if slot.stopped:
            during = "" if gone else " during its check"
            raise RunStopped(f"run {slot.run} was stopped by its sender{during}")
        if not gone:
            return ended
        if slot.reused:
            log.info("a warm check container was gone: replaced")
            continue
        raise Unavailable("a new warm check container died under its check")
    raise Unavailable("warm check containers keep dying")  # pragma: no cover


def run_warm_check(store: Store, task: Task, executor: WarmExecutor) -> Outcome | None:
    """``task`` (a check ``wanted`` sends warm) run by ``executor`` in a warm container or
    pod and collected as any run's output (``stage_collect.collect_task``: the limits,
    redaction, log and result record); None if it cannot go warm now (the runtime runs the
    check as any task then). An image that cannot be had is a recorded ``image_pull``
    failure; a permanent store refusal the request's failure."""
    assert task.history is not None
    clock = PhaseClock()
    redactor = Redactor(task.secrets)
    try:
        try:
            image = executor.image(task, clock)
            key = pool_key(team=task.team, image_digest=image, settings=task.resource_type)
            source = source_dir(task.history.resource_key)
            keep = stage_collect.stderr_bytes(redactor)
            ended = executor.check(task, key, source, image, clock, keep)
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
