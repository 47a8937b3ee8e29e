"""Warm check containers on Docker or Podman (docs/warm-checks.md): the engine's side of
``functions.runtimes.warm``.

A warm container's main process is a static pause program from this machine, bind-mounted
read-only and run as ``<pause> -P``: Podman's ``catatonit`` (its pause mode: PID 1 that
reaps orphans and does nothing else) unless WARM_CHECK_PAUSE names another (the cluster's
``pause.go`` ignores the flag). Supplied by us, not taken from the image, so a resource
image needs no shell or ``sleep``; as PID 1 it takes every process of the container with it
when the container is removed. Beside it, read-only too, the static ``rf-agent``
(``agent/``, WARM_CHECK_AGENT or on PATH). Each check is an exec of ``rf-agent run`` for the
check's source (its directory, HOME and TMPDIR, under ``SOURCES_ROOT``), with the request on
the exec's stdin (never in its spec), read like a task container's attach. A check past its
budget, or whose sender stops it, is ended alone by an exec of ``rf-agent kill``: the other
sources' checks and directories stay.

Labels: ``warm-check`` (the key, a hash) and ``warm-owner`` (this process: its pid and start
time). Replicas never share warm containers: each keeps its own, and the sweep at start
removes those whose owner process is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import docker.errors

from functions.errors import Unavailable
from functions.logs import fields
from functions.model import Task
from functions.phases import PhaseClock
from functions.runtimes.labels import MANAGED, MANAGED_BY_LABEL, WARM_KEY_LABEL, WARM_OWNER_LABEL
from functions.runtimes.local.attach import ENGINE_ERRORS, close_socket, pump
from functions.runtimes.local.engine_images import EngineImages
from functions.runtimes.warm.check import CheckEnd, ImagePullFailed, check_in_warm
from functions.runtimes.warm.lifecycle import WarmSet
from functions.runtimes.warm.pool import Gone, NotWarm, Slot, Warm
from functions.settings import WarmLimits
from functions.steps.pod_contract import MANAGED_BY

PAUSE_TARGET = "/.rf-pause"  # where the pause program is mounted in a warm container
AGENT_TARGET = "/.rf-agent"  # and rf-agent
SOURCES_ROOT = "/tmp/rf-sources"  # the sources' directories in a warm container
PAUSE_CANDIDATES = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
EXIT_SETTLE_SECONDS = 1  # after the stream's end, for the engine to see the exec's exit
KILL_SECONDS = 10  # past the budget, for the agent to end a check and its stream to end
KILLED = 137  # rf-agent run's exit code for a check it killed (its budget, or kill)
log = logging.getLogger("functions.container")


def default_pause() -> str:
    """catatonit, where Podman installs it (or on PATH); "" if none is found."""
    for path in PAUSE_CANDIDATES:
        if Path(path).is_file():
            return path
    return shutil.which("catatonit") or ""


def default_agent() -> str:
    """rf-agent on PATH, or where ``agent/build.sh`` puts it; "" if none is found."""
    built = Path.home() / ".cache" / "resource-functions" / "bin" / "rf-agent"
    return shutil.which("rf-agent") or (str(built) if built.is_file() else "")


def owner_id(pid: int | None = None) -> str:
    """This process (or ``pid``) as ``<pid>-<start time in clock ticks>``: a pid reused by
    another process does not pass for it. "" if /proc does not say."""
    pid = os.getpid() if pid is None else pid
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # Field 22 (starttime), counted after the command name's closing parenthesis.
    return f"{pid}-{stat.rsplit(')', 1)[1].split()[19]}"


def owner_alive(owner: str) -> bool:
    pid = owner.split("-", 1)[0]
    return pid.isdigit() and owner_id(int(pid)) == owner


class WarmContainers(WarmSet):
    """This replica's warm check containers: started, reused, expired, removed; the local
    runtime's ``check.WarmExecutor``."""

    def __init__(
        self, client: Any, limits: WarmLimits, network: str | None, images: EngineImages
    ) -> None:
        super().__init__(limits, self._remove_handle)
        self._client = client
        self._images = images
        self._network = network
        self._owner = owner_id()
        self._pause = limits.pause or default_pause()
        self._agent = limits.agent or default_agent()

    def image(self, task: Task, clock: PhaseClock) -> str:
        """The id of the check's image (pulled if the engine lacks it): a tag moved to
        another image is another key. ``ImagePullFailed`` if it cannot be had."""
        image, problem = self._images.id_of(task.resource_type.image, clock)
        if problem:
            raise ImagePullFailed(problem)
        return image

    def check(
        self, task: Task, key: str, source: str, image: str, clock: PhaseClock, keep: int
    ) -> CheckEnd | None:
        """Run the check of ``source`` in one of ``key``'s warm containers, one started from
        ``image`` (an image id) if none has room (``warm.check.WarmExecutor``)."""
        deadline = time.monotonic() + task.timeout_seconds
        limits = self.pool.limits
        ended = check_in_warm(
            self.pool,
            lambda: self.pool.take(key, task.team, source, task.run_id, limits.wait_seconds),
            clock,
            start=lambda slot: self._start(task, slot, image),
            execute=lambda slot: self._exec(slot, task, keep, deadline),
        )
        if ended is None:  # it could not go warm (the image gone?): ask next time
            self._images.forget(task.resource_type.image)
        return ended

    def sweep(self) -> int:
        """Remove the warm containers whose owner process is gone; how many."""
        filters = {"label": [MANAGED, WARM_KEY_LABEL]}
        try:
            listed = self._client.api.containers(all=True, filters=filters)
        except ENGINE_ERRORS as err:
            log.warning("warm sweep: cannot list containers", extra=fields(error=str(err)))
            return 0
        removed = 0
        for summary in listed:
            owner = str((summary.get("Labels") or {}).get(WARM_OWNER_LABEL, ""))
            if owner != self._owner and not owner_alive(owner):
                self._remove_handle(str(summary["Id"]))
                removed += 1
        if removed:
            log.info("swept warm check containers of owners gone", extra=fields(removed=removed))
        return removed

    def _start(self, task: Task, slot: Slot, image: str) -> Warm:
        """Create and start a warm container for ``slot``'s key and admit it."""
        if not self._pause or not self._agent:
            raise NotWarm(
                "no pause program or rf-agent for warm checks (install catatonit, build "
                "agent/ with agent/build.sh; or set WARM_CHECK_PAUSE and WARM_CHECK_AGENT)"
            )
        try:
            container = self._client.containers.create(
                image=image,
                entrypoint=[PAUSE_TARGET, "-P"],
                command=[],
                volumes={
                    self._pause: {"bind": PAUSE_TARGET, "mode": "ro"},
                    self._agent: {"bind": AGENT_TARGET, "mode": "ro"},
                },
                labels={
                    MANAGED_BY_LABEL: MANAGED_BY,
                    WARM_KEY_LABEL: slot.key,
                    WARM_OWNER_LABEL: self._owner,
                },
                privileged=task.resource_type.privileged,
                network=self._network,
            )
        except ENGINE_ERRORS as err:
            raise NotWarm(f"container engine: cannot create a warm container: {err}") from err
        try:
            container.start()
        except ENGINE_ERRORS as err:
            self._remove_handle(container.id)
            raise NotWarm(f"container engine: cannot start a warm container: {err}") from err
        return self.pool.admit(slot, container.id)

    def _exec(self, slot: Slot, task: Task, keep: int, deadline: float) -> CheckEnd:
        """Run the check through ``rf-agent run``, the request on stdin; its exit code (None:
        past its budget, when the agent killed its processes) and output. ``Gone`` if the
        container is not running (found so, or dying under it)."""
        assert slot.warm is not None
        handle = slot.warm.handle
        budget = max(deadline - time.monotonic(), 1.0)
        command = [AGENT_TARGET, "run", "--root", SOURCES_ROOT, "--source", slot.source]
        command += ["--timeout", f"{budget:.3f}"]
        command += ["--idle-seconds", str(int(self.pool.limits.idle_seconds))]
        started = time.monotonic()
        exec_id, sock = self._exec_start(handle, command, task.env)
        slot.cancel = lambda: self._kill(handle, slot.source)
        pumping = pump(sock, task.stdin, keep)
        output = pumping.output
        try:
            pumping.reader.join(budget + KILL_SECONDS)
            if pumping.reader.is_alive():  # the agent did not end it: end it from here
                self._kill(handle, slot.source)
                pumping.reader.join(KILL_SECONDS)
                code = None
            else:
                code = self._exit_code(exec_id, time.monotonic() + KILL_SECONDS)
        finally:
            slot.cancel = None
            close_socket(sock)
            pumping.feeder.join(5)
            pumping.reader.join(5)
        if code == KILLED and time.monotonic() - started >= budget:
            code = None  # over its budget: the agent killed its processes
        if (code != 0 or not output.complete) and not self._running(handle):
            raise Gone()  # killed under the check: not the check's own failure
        if code is not None and not output.complete and not slot.stopped:
            raise Unavailable("container engine: the check's output stream was cut")
        return code, output

    def _exec_start(self, handle: str, command: list[str], env: dict[str, str]) -> tuple[str, Any]:
        """An exec of ``command`` in the container, started, with its socket."""
        api = self._client.api
        try:
            exec_id = api.exec_create(
                handle, command, stdin=True, stdout=True, stderr=True, environment=env
            )["Id"]
            return exec_id, api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as err:
            if err.status_code in (404, 409) or not self._running(handle):
                raise Gone() from err
            raise Unavailable(f"container engine: cannot exec the check: {err}") from err
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: cannot exec the check: {err}") from err

    def _kill(self, handle: str, source: str) -> None:
        """End the check of ``source`` under way, with every process it started (logged,
        never raised: at worst the container goes with the check)."""
        command = [AGENT_TARGET, "kill", "--root", SOURCES_ROOT, "--source", source]
        try:
            self._client.api.exec_start(self._client.api.exec_create(handle, command)["Id"])
        except ENGINE_ERRORS as err:
            log.warning("cannot end a warm check", extra=fields(error=str(err)))

    def _exit_code(self, exec_id: str, deadline: float) -> int | None:
        """The exec's exit code once the engine has seen it (asked often for a second after
        the stream's end, then less often); None if it runs past ``deadline``."""
        settle = min(deadline, time.monotonic() + EXIT_SETTLE_SECONDS)
        while True:
            try:
                state = self._client.api.exec_inspect(exec_id)
            except ENGINE_ERRORS as err:
                raise Unavailable(f"container engine: {err}") from err
            if not state.get("Running"):
                code = state.get("ExitCode")
                return -1 if code is None else int(code)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02 if time.monotonic() < settle else 0.25)

    def _running(self, handle: str) -> bool:
        try:
            state = self._client.api.inspect_container(handle).get("State") or {}
        except docker.errors.NotFound:
            return False
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: {err}") from err
        return bool(state.get("Running"))

    def _remove_handle(self, handle: str) -> None:
        """Remove a warm container with every process in it (logged, never raised)."""
        try:
            self._client.api.remove_container(handle, force=True)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as err:
            log.warning("cannot remove a warm container", extra=fields(error=str(err)))
