"""The local runtime: one container per task on Docker or Podman (Docker-compatible API).

The working directory of in/out is a host temp dir bind-mounted at Concourse's path, so the
engine must share this machine's filesystem (a local socket, as with DOCKER_HOST=unix://…).
stdin goes through an attach socket, so the payload never touches disk or the container spec
(``container_script``: the script from its start to its exit and output). Images are pulled
by ``engine_images``; a check may run in a warm container instead (``warm.check``). Every
engine call is wrapped: trouble with the engine is ``Unavailable`` (503), never a crash.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests.exceptions

from functions.errors import RequestIdReused, RunStopped, Unavailable
from functions.ledger import results, tombstones
from functions.logs import fields
from functions.model import SCRIPTS, WORKDIRS, Outcome, Task
from functions.phases import PhaseClock
from functions.redaction import Redactor
from functions.runtimes.background import (
    BackgroundRuns,
    Ended,
    InRequest,
    RunsInFlight,
    end_async_run,
    outcome_of_async,
)
from functions.runtimes.labels import (
    MANAGED,
    MANAGED_BY_LABEL,
    REQUEST_DIGEST_LABEL,
    RUN_LABEL,
)
from functions.runtimes.local.attach import ENGINE_ERRORS
from functions.runtimes.local.container_script import feed_and_wait, read_logs, remaining, wait
from functions.runtimes.local.engine_images import EngineImages
from functions.runtimes.local.sweep import Sweeper
from functions.runtimes.output import Output
from functions.runtimes.warm.check import adoptable, run_warm_check, wanted
from functions.runtimes.warm.engine import WarmContainers
from functions.runtimes.warm.pool import WARM_OFF, WarmCounts
from functions.settings import WarmLimits
from functions.steps import stage_collect
from functions.steps.outcome import failed, final_failure
from functions.steps.pod_contract import MANAGED_BY
from storage import Store
from storage.archive import ArchiveOptions, Limits
from storage.store_errors import StorageError

if TYPE_CHECKING:
    from functions.settings import Settings

log = logging.getLogger("functions.container")


@dataclass(frozen=True)
class ContainerConfig:
    archive: ArchiveOptions
    limits: Limits
    network: str | None = None  # None: the engine's default network
    workroot: str | None = None  # where work dirs are made (default: the system temp dir)
    sink: str = ""  # K_SINK: where asynchronous tasks post their reply
    warm: WarmLimits = WARM_OFF  # by hand: off; from_settings: WARM_CHECKS (default on)


class ContainerRuntime:
    def __init__(self, client: Any, store: Store, config: ContainerConfig) -> None:
        self._client = client
        self._store = store
        self._config = config
        self._lock = threading.Lock()  # guards the dict and set below
        self._started: dict[str, str] = {}  # run id -> request digest, while it runs
        self._waiting: set[str] = set()  # run ids accepted whose script has not started
        self._background = BackgroundRuns("container-run")
        self._in_request = InRequest()
        self._cleanup = BackgroundRuns("container-remove", limit=2)
        self._runs = RunsInFlight()
        self._sweeper = Sweeper(store, self._list_exited, self._remove_swept)
        self._images = EngineImages(client, config.warm.image_seconds)
        self._warm = (
            WarmContainers(client, config.warm, config.network, self._images)
            if config.warm.enabled
            else None
        )

    @classmethod
    def from_settings(cls, settings: Settings, store: Store) -> ContainerRuntime:
        # A fixed API version makes no call here: an engine that is down at start answers
        # 503 per request instead of keeping the service from starting.
        try:
            client = docker.from_env(
                environment=engine_environment(settings.engine_env),
                timeout=60,
                version=settings.docker_api_version,
            )
        except docker.errors.DockerException as err:
            raise Unavailable(f"container engine unreachable (DOCKER_HOST): {err}") from err
        config = ContainerConfig(
            archive=settings.archive,
            limits=settings.limits,
            network=settings.container_network or None,
            workroot=settings.work_dir or None,
            sink=settings.sink,
            warm=settings.warm,
        )
        return cls(client, store, config)

    def start_sweeps(self) -> None:
        """Sweep leftover containers now and every few minutes (functions.runtimes.local.sweep),
        and warm check containers of owners gone (functions.runtimes.warm.engine)."""
        self._sweeper.start()
        if self._warm is not None:
            self._warm.start()

    def warm_counts(self) -> WarmCounts:
        return self._warm.counts() if self._warm is not None else WarmCounts()

    def adopts(self, task: Task) -> bool:
        return adoptable(self._warm, task)

    def close(self) -> None:
        """Drain, then let go of the engine: wait for the asynchronous runs (they reply when
        done) and the synchronous ones under way (later ones get ``Unavailable``), then for
        the removals they queued; remove the warm check containers. The caller bounds it
        (gunicorn's graceful_timeout)."""
        self._background.close()
        self._runs.close()
        if self._warm is not None:
            self._warm.close()
        self._sweeper.stop()
        self._cleanup.close()
        self._client.close()

    def start(self, task: Task, ended: Ended | None = None) -> None:
        """Run in the background and post the reply to K_SINK (once per run id). A check
        that goes warm runs in its request and posts its reply before the 202
        (``InRequest``), as on Kubernetes."""
        if wanted(self._warm, task) and self._in_request.run(
            self._store, self._config.sink, task, ended, lambda: self._admitted_warm_check(task)
        ):
            return
        with self._lock:
            if task.run_id in self._started:
                if self._started[task.run_id] != task.request_digest:
                    raise RequestIdReused()
                return
            self._started[task.run_id] = task.request_digest
            self._waiting.add(task.run_id)
        try:
            self._background.submit(self._run_and_reply, task, ended)
        except Unavailable:
            with self._lock:
                self._started.pop(task.run_id, None)
                self._waiting.discard(task.run_id)
            raise

    def ready(self) -> None:
        """``Unavailable`` unless the container engine answers a ping."""
        try:
            self._client.ping()
        except (docker.errors.APIError, requests.exceptions.RequestException) as err:
            raise Unavailable(f"the container engine does not answer: {err}") from err

    def tasks_waiting(self) -> int:
        """Tasks accepted whose script has not started: queued behind ``ASYNC_RUN_LIMIT``
        others, pulling the image, staging inputs, creating the container."""
        with self._lock:
            return len(self._waiting)

    def _script_starts(self, run: str) -> None:
        with self._lock:
            self._waiting.discard(run)

    def _run_and_reply(self, task: Task, ended: Ended | None) -> None:
        outcome = outcome_of_async(task, lambda: self.run(task))
        try:
            end_async_run(self._store, self._config.sink, task, outcome, ended)
        finally:
            with self._lock:
                self._started.pop(task.run_id, None)

    def run(self, task: Task) -> Outcome:
        """Run the task once per run id: its container is named after the run id, so after a
        crash of this service or of the engine a redelivery adopts the container (running or
        exited) and reads its result instead of starting the script again. The container and
        its work directory stay until the result is stored; an ``Unavailable`` leaves them
        for the redelivery."""
        with self._runs.admitted():
            if wanted(self._warm, task):
                outcome = self._warm_check(task)
                if outcome is not None:
                    return outcome
            return self._run(task)

    def _admitted_warm_check(self, task: Task) -> Outcome | None:
        with self._runs.admitted():
            return self._warm_check(task)

    def _warm_check(self, task: Task) -> Outcome | None:
        """The check as an exec in its warm container (``warm.check``); None if that one is
        busy or none could be started (then it runs in a new one)."""
        assert self._warm is not None
        with self._lock:
            self._waiting.add(task.run_id)
        try:
            return run_warm_check(self._store, task, self._warm)
        finally:
            self._script_starts(task.run_id)

    def _run(self, task: Task) -> Outcome:
        root = self._run_root(task.run_id)
        workdir = root / task.action
        clock = PhaseClock()
        with self._lock:
            self._waiting.add(task.run_id)
        try:
            container = self._existing(task)
            if container is None and WORKDIRS[task.action]:  # a check mounts no work dir
                shutil.rmtree(root, ignore_errors=True)  # a crash's leftovers: nothing ran
                workdir.mkdir(parents=True)
            outcome = self._outcome(task, workdir, container, clock)
        except StorageError as err:  # a permanent store refusal; retryable ones raise here
            outcome = self._record(task, final_failure(task.action, err))
        finally:
            self._script_starts(task.run_id)  # or it never will
        # The result is stored, so nothing is left to adopt and a redelivery replays the
        # record: the removal need not hold up the reply.
        self._cleanup.submit(self._remove_run, task.run_id, root)
        return clock.attach(outcome)

    def _run_root(self, run: str) -> Path:
        return Path(self._config.workroot or tempfile.gettempdir()) / f"rf-{run}"

    def _existing(self, task: Task) -> Any:
        """This run's container, if one is left from an earlier delivery; one that was
        created but never started is removed (its script never ran). A container of another
        request with the same run id raises ``RequestIdReused``."""
        run = task.run_id
        try:
            container = self._client.containers.get(container_name(run))
        except docker.errors.NotFound:
            return None
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: {err}") from err
        if _request_of(container) not in ("", task.request_digest):
            raise RequestIdReused()
        if container.status == "created":
            _remove(container)
            return None
        log.info(
            "adopting the container of an earlier delivery",
            extra=fields(run_id=run, status=container.status),
        )
        return container

    def _outcome(self, task: Task, workdir: Path, container: Any, clock: PhaseClock) -> Outcome:
        """The stored outcome: of the adopted container, or of a new one."""
        output: Output | None = None  # an adopted container's is read from the engine's logs
        redactor = Redactor(task.secrets)
        keep = stage_collect.stderr_bytes(redactor)
        if container is None:
            self._not_stopped(task, None, workdir)
            try:
                if task.inputs:
                    with clock.phase("stage"):
                        stage_collect.stage(self._store, task.inputs, workdir, self._config.limits)
            except stage_collect.StageFailed as err:
                return self._record(task, failed(task.action, "storage", str(err)))
            with clock.phase("create"):
                container = self._create(task, workdir)
            if container is None:  # the engine lacks the image: asked only now, saving a call
                with clock.phase("image_pull"):
                    image_problem = self._images.ensure(task.resource_type.image)
                if image_problem:
                    return self._record(task, failed(task.action, "image_pull", image_problem))
                with clock.phase("create"):
                    container = self._create(task, workdir)
                if container is None:
                    raise Unavailable(f"image {task.resource_type.image} vanished after its pull")
            self._not_stopped(task, container, workdir)
            self._script_starts(task.run_id)
            with clock.phase("script"):
                exit_code, output = feed_and_wait(container, task, keep)
        else:
            self._script_starts(task.run_id)  # an adopted container's script has started
            try:
                with clock.phase("script"):
                    left = remaining(container, task.timeout_seconds)
                    exit_code = wait(container, left)
                with clock.phase("output"):
                    output = read_logs(container, with_stdout=exit_code is not None, keep=keep)
            except Unavailable:
                # The process that started the container may live on (an orphaned worker):
                # if it stored the result and removed the container, that result stands.
                stored = results.read_outcome(self._store, task.run_id, request=task.request_digest)
                if stored is None:
                    raise
                return stored
        return self._collect(container, task, workdir, exit_code, output, redactor, clock)

    def _record(self, task: Task, outcome: Outcome) -> Outcome:
        return results.record_outcome(
            self._store, task.run_id, outcome, request=task.request_digest
        )

    def _not_stopped(self, task: Task, created: Any, workdir: Path) -> None:
        """``RunStopped`` if the run's sender stopped it (before its container is created,
        and once more before it starts): nothing of it is left."""
        if not tombstones.stopped(self._store, task.run_id):
            return
        if created is not None:
            _remove(created)
        shutil.rmtree(workdir.parent, ignore_errors=True)
        raise RunStopped(f"run {task.run_id} was stopped by its sender: its script is not run")

    def stop(self, run: str, action: str) -> None:
        """Kill the run's container (its run then ends as a killed script does) and end its
        warm check if this process runs one."""
        if self._warm is not None:
            self._warm.stop(run)
        try:
            self._client.containers.get(container_name(run)).kill()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as err:  # not running (exited, or created only)
            log.info("stop: the container was not killed", extra=fields(run_id=run, error=str(err)))
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: {err}") from err

    def _collect(
        self,
        container: Any,
        task: Task,
        workdir: Path,
        exit_code: int | None,
        output: Output | None,
        redactor: Redactor,
        clock: PhaseClock,
    ) -> Outcome:
        if output is None:
            with clock.phase("output"):
                keep = stage_collect.stderr_bytes(redactor)
                output = read_logs(container, with_stdout=exit_code is not None, keep=keep)
        return stage_collect.collect_task(
            self._store,
            task,
            self._config.archive,
            exit_code=exit_code,
            stdout=output.stdout,
            stderr=output.stderr,
            redactor=redactor,
            clock=clock,
            output_dir=workdir if task.action == "get" else None,
        )

    def _remove_run(self, run: str, root: Path) -> None:
        try:
            _remove(self._client.containers.get(container_name(run)))
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as err:  # logged, not raised: the outcome is already stored
            log.warning("cannot remove a container", extra=fields(error=str(err)))
        shutil.rmtree(root, ignore_errors=True)

    def _list_exited(self) -> list[dict[str, Any]]:
        """One engine call: the summaries (id, state, labels) of our exited containers."""
        filters = {"label": MANAGED, "status": "exited"}
        try:
            return list(self._client.api.containers(all=True, filters=filters))
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: {err}") from err

    def _remove_swept(self, container_id: str, run: str) -> bool:
        """Remove a swept container (not forced: one that runs again stays) and its work dir."""
        try:
            self._client.api.remove_container(container_id)
        except docker.errors.NotFound:
            return False  # removed meanwhile by the run's own cleanup, with its work dir
        except ENGINE_ERRORS as err:
            log.warning("sweep: cannot remove a container", extra=fields(error=str(err)))
            return False
        shutil.rmtree(self._run_root(run), ignore_errors=True)
        log.info("swept the container of a finished run", extra=fields(run_id=run))
        return True

    def _create(self, task: Task, workdir: Path) -> Any:
        """The created container; None if the engine lacks the image."""
        target = WORKDIRS[task.action]
        try:
            return self._client.containers.create(
                image=task.resource_type.image,
                name=container_name(task.run_id),
                entrypoint=[SCRIPTS[task.action]],
                command=[target] if target else [],
                environment=task.env,
                stdin_open=True,
                volumes={str(workdir): {"bind": target, "mode": "rw"}} if target else {},
                labels={
                    MANAGED_BY_LABEL: MANAGED_BY,
                    RUN_LABEL: task.run_id,
                    REQUEST_DIGEST_LABEL: task.request_digest,
                },
                privileged=task.resource_type.privileged,
                network=self._config.network,
            )
        except docker.errors.ImageNotFound:
            return None
        except ENGINE_ERRORS as err:  # a name conflict included: another process runs it
            raise Unavailable(f"container engine: cannot create container: {err}") from err


def _request_of(container: Any) -> str:
    """The request digest a container was created for ("" if it predates the label)."""
    labels = (container.attrs.get("Config") or {}).get("Labels") or {}
    return str(labels.get(REQUEST_DIGEST_LABEL) or "")


def container_name(run: str) -> str:
    """The container of a run: found again by name after a crash."""
    return f"rf-{run}"


def engine_environment(env: Mapping[str, str]) -> dict[str, str]:
    """DOCKER_HOST as given; unset, Docker's socket if present, else Podman's (rootless,
    then root), so a machine with only Podman works without configuration."""
    env = dict(env)
    if env.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists():
        return env
    candidates = ["/run/podman/podman.sock"]
    if env.get("XDG_RUNTIME_DIR"):
        candidates.insert(0, f"{env['XDG_RUNTIME_DIR']}/podman/podman.sock")
    for path in candidates:
        if Path(path).exists():
            env["DOCKER_HOST"] = f"unix://{path}"
            break
    return env


def _remove(container: Any) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except ENGINE_ERRORS as err:  # logged, not raised: the outcome is already decided
        log.warning("cannot remove a container", extra=fields(error=str(err)))
