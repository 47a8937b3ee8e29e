"""Stop requests on the local runtime, real Podman (functions/service/stop_requests.py): a stop
that comes first means no container ever; one that comes while the script runs kills its
container, and no delivery of the request runs it again."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest
import requests
from cloudevents.core.bindings.http import to_binary_event

from tests.support.events import request_event
from tests.support.services import resource_types, start_services


@pytest.fixture(scope="module")
def services(docker_host, resource_image, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stops")
    (tmp_path / "store").mkdir()
    started = start_services(
        {
            "DOCKER_HOST": docker_host,
            "RESOURCE_TYPES": resource_types(resource_image),
            "STORE_URL": (tmp_path / "store").as_uri(),
            "CACHE_SECRET": "e2e-stops",
        },
        tmp_path / "services.log",
        actions=("get",),
    )
    yield started
    started.stop()


@pytest.fixture(scope="module")
def engine(docker_host):
    client = docker.DockerClient(base_url=docker_host)
    yield client
    client.close()


def post(url: str, event, timeout: float = 120) -> requests.Response:
    message = to_binary_event(event)
    return requests.post(url, headers=dict(message.headers), data=message.body, timeout=timeout)


def stop_of(request) -> object:
    return request_event(
        "get",
        {},
        event_id=f"stop-{request.get_id()}",
        source=request.get_source(),
        stops=request.get_id(),
    )


def get_request(delay: int):
    return request_event(
        "get",
        {
            "type": "test",
            "source": {"delay": delay, "nonce": uuid.uuid4().hex},
            "version": {"ref": "1"},
        },
        event_id=f"get-{uuid.uuid4().hex[:8]}",
    )


def test_a_stop_before_its_request_means_no_container_ever(services, engine) -> None:
    url = services.urls["get"]
    request = get_request(delay=0)
    before = {c.id for c in engine.containers.list(all=True, filters={"label": "run-id"})}
    stopped = post(url, stop_of(request))
    assert (stopped.status_code, stopped.content) == (200, b"")
    for _ in range(2):  # the request, then its redelivery
        answered = post(url, request)
        assert (answered.status_code, answered.content) == (200, b"")
    after = {c.id for c in engine.containers.list(all=True, filters={"label": "run-id"})}
    assert after <= before


def test_a_stop_while_the_script_runs_kills_it_and_it_never_runs_again(services, engine) -> None:
    url = services.urls["get"]
    request = get_request(delay=60)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(post, url, request)
        deadline = time.monotonic() + 60
        while not [
            c for c in engine.containers.list(filters={"label": "run-id", "status": "running"})
        ]:
            assert time.monotonic() < deadline, "the get's container never ran"
            assert not running.done(), running.result().content
            time.sleep(0.2)
        began = time.monotonic()
        stopped = post(url, stop_of(request))
        assert (stopped.status_code, stopped.content) == (200, b"")
        answered = running.result(timeout=45)
    assert time.monotonic() - began < 30, "the script was not killed"
    # The run under way ends as a killed script does (a failure reply, or 503 if the engine
    # saw the container go first): never a success.
    assert answered.status_code in (200, 503)
    assert b"succeeded" not in answered.content
    again = post(url, request)  # a redelivery: stopped, so neither replayed nor run
    assert (again.status_code, again.content) == (200, b"")
    assert not engine.containers.list(filters={"label": "run-id", "status": "running"})
