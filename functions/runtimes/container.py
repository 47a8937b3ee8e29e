"""The local runtime: one container per task on Docker or Podman (Docker-compatible API).

The working directory of in/out is a host temp dir bind-mounted at Concourse's path, so the
engine must share this machine's filesystem (a local socket, as with DOCKER_HOST=unix://…).
stdin goes through an attach socket, so the payload never touches disk or the container spec.
"""
from __future__ import annotations

import logging
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from functions import keys, steps
from functions.errors import Unavailable
from functions.logs import fields
from functions.model import SCRIPTS, WORKDIRS, Outcome, Task
from functions.outcome import failed, redact, secret_strings
from functions.sink import post_outcome
from storage import Store
from storage.archive import ArchiveOptions, Limits
from storage.errors import StorageError

MANAGED_BY = "resource-functions"
API_VERSION = "1.41"  # Docker 20.10+, Podman 3+
log = logging.getLogger("functions.container")


@dataclass(frozen=True)
class ContainerConfig:
    archive: ArchiveOptions
    limits: Limits
    network: str | None = None  # None: the engine's default network
    workroot: str | None = None  # where work dirs are made (default: the system temp dir)
    sink: str = ""  # K_SINK: where asynchronous tasks post their reply


class ContainerRuntime:
    def __init__(self, client: Any, store: Store, config: ContainerConfig) -> None:
        self._client = client
        self._store = store
        self._config = config
        self._pull_lock = threading.Lock()
        self._started: set[str] = set()

    @classmethod
    def from_settings(cls, settings: Any, store: Store) -> ContainerRuntime:
        env = settings.environ
        try:
            # A fixed API version makes no call here: an engine that is down at start answers
            # 503 per request instead of keeping the service from starting.
            client = docker.from_env(environment=engine_environment(env), timeout=60,
                                     version=env.get("DOCKER_API_VERSION") or API_VERSION)
        except docker.errors.DockerException as err:
            raise Unavailable(f"container engine unreachable (DOCKER_HOST): {err}") from err
        config = ContainerConfig(
            archive=settings.archive,
            limits=settings.limits,
            network=env.get("CONTAINER_NETWORK") or None,
            workroot=env.get("WORK_DIR") or None,
            sink=env.get("K_SINK", ""),
        )
        return cls(client, store, config)

    def close(self) -> None:
        self._client.close()

    def start(self, task: Task) -> None:
        """Run in the background and post the reply to K_SINK (once per run id)."""
        with self._pull_lock:
            if task.run_id in self._started:
                return
            self._started.add(task.run_id)
        threading.Thread(target=self._run_and_reply, args=(task,), daemon=True).start()

    def _run_and_reply(self, task: Task) -> None:
        try:
            post_outcome(self._config.sink, task, self.run(task))
        except Exception:
            log.exception("asynchronous task failed", extra=fields(run_id=task.run_id))
        finally:
            with self._pull_lock:
                self._started.discard(task.run_id)

    def run(self, task: Task) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="rf-", dir=self._config.workroot) as tmp:
            workdir = Path(tmp) / task.action
            workdir.mkdir()
            try:
                outcome = self._run_in(task, workdir)
            except StorageError as err:
                if err.retryable:
                    raise Unavailable(f"store: {err}") from err
                outcome = failed(task.action, "storage", str(err))
            return steps.record_outcome(self._store, task.run_id, outcome)

    def _run_in(self, task: Task, workdir: Path) -> Outcome:
        try:
            steps.stage(self._store, task.inputs, workdir, self._config.limits)
        except steps.StageFailed as err:
            return failed(task.action, "storage", str(err))
        image_problem = self._ensure_image(task.resource_type.image)
        if image_problem:
            return failed(task.action, "image_pull", image_problem)
        return self._execute(task, workdir)

    def _execute(self, task: Task, workdir: Path) -> Outcome:
        container = self._create(task, workdir)
        try:
            exit_code = self._feed_and_wait(container, task)
            if exit_code is None:
                log = redact(_logs(container, stdout=False), secret_strings(task.stdin))
                steps.write_once(self._store, keys.log_key(task.run_id), log.encode())
                return failed(task.action, "timeout",
                              f"the resource script ran longer than {task.timeout_seconds:g}s", log)
            spec = steps.CollectSpec(run_id=task.run_id, action=task.action,
                                     cache_key=task.cache_key, archive=self._config.archive)
            return steps.collect(
                self._store, spec, exit_code=exit_code,
                stdout=_logs_bytes(container, stdout=True),
                stderr=_logs_bytes(container, stdout=False),
                stdin=task.stdin, output_dir=workdir if task.action == "get" else None,
            )
        finally:
            _remove(container)

    def _create(self, task: Task, workdir: Path) -> Any:
        target = WORKDIRS[task.action]
        try:
            return self._client.containers.create(
                image=task.resource_type.image,
                entrypoint=[SCRIPTS[task.action]],
                command=[target] if target else [],
                environment=task.env,
                stdin_open=True,
                volumes={str(workdir): {"bind": target, "mode": "rw"}} if target else {},
                labels={"app.kubernetes.io/managed-by": MANAGED_BY, "run-id": task.run_id},
                privileged=task.resource_type.privileged,
                network=self._config.network,
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
            raise Unavailable(f"container engine: cannot create container: {err}") from err

    def _feed_and_wait(self, container: Any, task: Task) -> int | None:
        """Start with stdin attached, send the payload, wait; None means timed out (killed)."""
        try:
            sock = container.attach_socket(params={"stdin": 1, "stream": 1})
            container.start()
            raw = getattr(sock, "_sock", sock)
            raw.sendall(task.stdin)
            raw.shutdown(socket.SHUT_WR)
            started = time.monotonic()
            try:
                status = container.wait(timeout=task.timeout_seconds)
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
                if time.monotonic() - started < task.timeout_seconds * 0.9:
                    raise Unavailable(f"container engine: lost the container: {err}") from err
                container.kill()
                return None
            finally:
                sock.close()
            return int(status.get("StatusCode", -1))
        except docker.errors.DockerException as err:
            raise Unavailable(f"container engine: {err}") from err

    def _ensure_image(self, image: str) -> str | None:
        """Pull the image if the engine lacks it; return a problem text if it can't be had."""
        try:
            self._client.images.get(image)
            return None
        except docker.errors.ImageNotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
            raise Unavailable(f"container engine: {err}") from err
        with self._pull_lock:
            try:
                self._client.images.pull(image)
                return None
            except (docker.errors.ImageNotFound, docker.errors.NotFound) as err:
                return f"cannot pull image {image}: {_explanation(err)}"
            except docker.errors.APIError as err:
                return f"cannot pull image {image}: {_explanation(err)}"


def engine_environment(env: Mapping[str, str]) -> dict[str, str]:
    """DOCKER_HOST as given; unset, Docker's socket if present, else Podman's (root, then
    rootless), so a machine with only Podman works without configuration."""
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


def _logs_bytes(container: Any, *, stdout: bool) -> bytes:
    return bytes(container.logs(stdout=stdout, stderr=not stdout))


def _logs(container: Any, *, stdout: bool) -> str:
    try:
        return _logs_bytes(container, stdout=stdout).decode("utf-8", errors="replace")
    except docker.errors.DockerException:
        return ""


def _remove(container: Any) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


def _explanation(err: Exception) -> str:
    return str(getattr(err, "explanation", None) or err)
