"""The local runtime reads a script's stdout and stderr once, as they come, and keeps them
apart and within their limits (stdout's head up to 8 MiB + 1 byte, stderr's last 4 MiB).
Real Podman, the file store, the runtime in-process."""

from __future__ import annotations

import uuid
from typing import Any

import docker
import pytest

from functions.model import Action, ResourceType, Task
from functions.protocol import MAX_STDERR_BYTES, MAX_STDOUT_BYTES, stdin_payload
from functions.runtimes.local.container import ContainerConfig, ContainerRuntime
from storage import open_store
from storage.archive import ArchiveOptions, Limits


@pytest.fixture
def runtime(docker_host, tmp_path):
    store = open_store(tmp_path.as_uri())
    made = ContainerRuntime(
        docker.DockerClient(base_url=docker_host),
        store,
        ContainerConfig(archive=ArchiveOptions(), limits=Limits(), workroot=str(tmp_path)),
    )
    yield made
    made.close()


def task_of(image: str, action: Action, source: dict[str, Any]) -> Task:
    version = {"ref": "1"} if action == "get" else None
    return Task(
        run_id=uuid.uuid4().hex,
        action=action,
        resource_type=ResourceType(image=image),
        stdin=stdin_payload(action, source, version, {}),
        env={},
        inputs={},
        cache_key=None,
        timeout_seconds=60,
    )


def stored_log(runtime: ContainerRuntime, task: Task) -> bytes:
    with runtime._store.open(f"logs/{task.run_id}.log") as stream:
        return stream.read()


@pytest.mark.parametrize("action", ["check", "get"])
def test_stdout_and_stderr_stay_apart(runtime, resource_image, action):
    task = task_of(resource_image, action, {"count": 1})
    outcome = runtime.run(task)
    assert outcome.succeeded, outcome.failure
    log = stored_log(runtime, task)
    assert f"{'in' if action == 'get' else 'check'} mode=ok".encode() in log
    assert b'"ref"' not in log and b"ignored trailing output" not in log
    # Read once, through the attach stream: no "output" phase (the engine's logs, read again).
    assert [p.name for p in outcome.phases if p.name in ("script", "output")] == ["script"]


def test_output_over_the_limits_is_cut_to_them(runtime, resource_image):
    task = task_of(resource_image, "check", {"mode": "flood"})
    outcome = runtime.run(task)
    assert outcome.failure is not None and outcome.failure.kind == "invalid_output"
    assert f"larger than {MAX_STDOUT_BYTES} bytes" in outcome.failure.message
    log = stored_log(runtime, task)
    assert len(log) == MAX_STDERR_BYTES  # the tail of a 4.8 MiB stderr
    assert log.endswith(b"stderr-end-marker\n")
    assert b"o" not in log.removesuffix(b"stderr-end-marker\n")  # no stdout byte in it
