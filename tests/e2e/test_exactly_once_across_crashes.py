"""Exactly once with the local runtime, also when the service or the container engine dies
mid-run: the container is named after the run id, a redelivery adopts it (running or exited)
and reads its result; it is removed once the result is stored. Real services, real Podman."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import docker
import pytest
import requests

from functions.errors import RequestIdReused
from functions.model import ResourceType, Task
from functions.protocol import MAX_STDERR_BYTES, stdin_payload
from functions.runtimes.local.container import ContainerConfig, ContainerRuntime
from functions.runtimes.local.container_script import feed_and_wait
from storage import open_store
from storage.archive import ArchiveOptions, Limits
from testbed.podman import podman_service
from tests.support.engine import containers_of, service_env, wait_running
from tests.support.events import request_event, send
from tests.support.runs import run_of
from tests.support.services import start_services


def starts(docker_host: str, run: str, since: float) -> int:
    """Containers the engine started for this run (its event log). Podman's file event log
    can lag a busy engine by a moment: an empty answer is asked again for a few seconds. In a
    long session it has also missed a start altogether (once in a full CI run), so the tests
    assert at most one start; the reply with the script's output proves the one run."""
    deadline = time.monotonic() + 15
    while True:
        count = _logged_starts(docker_host, run, since)
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


def _logged_starts(docker_host: str, run: str, since: float) -> int:
    client = docker.DockerClient(base_url=docker_host).api
    filters = {"event": ["start"], "label": [f"run-id={run}"]}
    response = client.get(
        client._url("/events"),
        stream=True,
        timeout=30,
        params={
            "since": str(int(since)),
            "until": str(int(time.time()) + 1),
            "stream": "false",
            "filters": json.dumps(filters),
        },
    )
    response.raise_for_status()
    return b"".join(response.iter_content(65536)).decode().count('"status":"start"')


def container_left(docker_host: str, run: str) -> bool:
    return bool(containers_of(docker_host, run))


def send_in_background(url: str, event: Any) -> threading.Thread:
    def post() -> None:
        try:
            send(url, event, timeout=60)
        except requests.RequestException:
            pass  # the service dies under it

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def slow_check(seconds: int = 5) -> Any:
    return request_event(
        "check",
        {"type": "test", "source": {"delay": seconds, "count": 2, "nonce": uuid.uuid4().hex}},
    )


def test_a_service_killed_mid_run_is_not_run_twice(docker_host, resource_image, tmp_path):
    env = service_env(docker_host, resource_image, tmp_path)
    since = time.time() - 1
    first = start_services(env, tmp_path / "first.log", actions=("check",))
    event = slow_check()
    run = run_of("e2e", event.get_source(), event.get_id(), "check")
    try:
        send_in_background(first.urls["check"], event)
        wait_running(docker_host, run)
        first.procs[0].kill()  # SIGKILL: no cleanup of any kind
        first.procs[0].wait(10)
    finally:
        first.stop()
    second = start_services(env, tmp_path / "second.log", actions=("check",))
    try:
        status, reply, _ = send(second.urls["check"], event)
    finally:
        second.stop()
    assert status == 200 and reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}]
    assert starts(docker_host, run, since) <= 1
    assert not container_left(docker_host, run)
    assert not (tmp_path / f"rf-{run}").exists()
    assert (tmp_path / "store" / "results" / f"{run}.json").exists()


def test_a_restarted_engine_does_not_run_it_twice(docker_host, resource_image, tmp_path):
    sock = tmp_path / "engine.sock"
    engine = podman_service(sock, tmp_path / "engine.log")
    env = service_env(f"unix://{sock}", resource_image, tmp_path)
    since = time.time() - 1
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    event = slow_check()
    run = run_of("e2e", event.get_source(), event.get_id(), "check")
    try:
        status: list[int] = []
        thread = threading.Thread(
            target=lambda: status.append(send(services.urls["check"], event)[0]), daemon=True
        )
        thread.start()
        wait_running(docker_host, run)
        engine.kill()  # the API goes away; the container (conmon) keeps running
        engine.wait(10)
        thread.join(30)
        assert status == [503]  # lost the engine: Knative redelivers
        engine = podman_service(sock, tmp_path / "engine.log")
        code, reply, _ = send(services.urls["check"], event)
        assert code == 200 and reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}]
    finally:
        services.stop()
        engine.terminate()
        engine.wait(10)
    assert starts(docker_host, run, since) <= 1
    assert not container_left(docker_host, run)


def test_an_exited_container_left_behind_is_adopted(docker_host, resource_image, tmp_path):
    """The container finished while nobody watched (service down): its result is read."""
    runtime = ContainerRuntime(
        docker.DockerClient(base_url=docker_host),
        open_store(tmp_path.as_uri()),
        ContainerConfig(archive=ArchiveOptions(), limits=Limits(), workroot=str(tmp_path)),
    )
    task = check_task(resource_image, {"count": 1, "nonce": uuid.uuid4().hex})
    since = time.time() - 1
    leftover = runtime._create(task, tmp_path)
    feed_and_wait(leftover, task, MAX_STDERR_BYTES)  # ran and exited; then "the service died"
    outcome = runtime.run(task)
    runtime.close()  # waits for the removal, which no longer holds up the reply
    assert outcome.data == {"versions": [{"ref": "1"}]}
    assert starts(docker_host, task.run_id, since) <= 1
    assert not container_left(docker_host, task.run_id)


def test_a_container_left_by_another_request_is_never_adopted(
    docker_host, resource_image, tmp_path
):
    """A left-behind container of the same run id but another request (the pair reused for
    other data) is refused (400), not read; the request it belongs to still adopts it."""
    runtime = ContainerRuntime(
        docker.DockerClient(base_url=docker_host),
        open_store(tmp_path.as_uri()),
        ContainerConfig(archive=ArchiveOptions(), limits=Limits(), workroot=str(tmp_path)),
    )
    task = replace(check_task(resource_image, {"count": 1}), request_digest="a" * 64)
    leftover = runtime._create(task, tmp_path)
    feed_and_wait(leftover, task, MAX_STDERR_BYTES)
    try:
        with pytest.raises(RequestIdReused):
            runtime.run(replace(task, request_digest="b" * 64))
        assert container_left(docker_host, task.run_id)  # still there for its own request
        assert runtime.run(task).data == {"versions": [{"ref": "1"}]}
    finally:
        runtime.close()
    assert not container_left(docker_host, task.run_id)


class CountingStore:
    """A store that counts writes per key (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.puts: dict[str, int] = {}

    def put(self, key: str, stream: Any) -> Any:
        self.puts[key] = self.puts.get(key, 0) + 1
        return self.inner.put(key, stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def check_task(image: str, source: dict[str, Any]) -> Task:
    return Task(
        run_id=uuid.uuid4().hex,
        action="check",
        resource_type=ResourceType(image=image),
        stdin=stdin_payload("check", source, None, {}),
        env={},
        inputs={},
        cache_key=None,
        timeout_seconds=60,
    )


def test_a_run_writes_its_result_once(docker_host, resource_image, tmp_path):
    store = CountingStore(open_store(tmp_path.as_uri()))
    runtime = ContainerRuntime(
        docker.DockerClient(base_url=docker_host),
        store,
        ContainerConfig(archive=ArchiveOptions(), limits=Limits(), workroot=str(tmp_path)),
    )
    for source in ({"count": 1}, {"mode": "fail"}, {"mode": "malformed"}):
        task = check_task(resource_image, source)
        runtime.run(task)
        assert store.puts[f"results/{task.run_id}.json"] == 1, source
