"""Where a run spent its time: its phases in the "run finished" log line and in the
histogram resource_function_run_phase_seconds{action, phase}. Real services, real Podman."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.events import request_event, send
from tests.support.runs import run_of
from tests.support.services import E2E_CACHE_SECRET, resource_types, start_services


@pytest.fixture(scope="module")
def services(docker_host, resource_image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phases")
    (tmp / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": resource_types(resource_image),
        "CACHE_SECRET": E2E_CACHE_SECRET,
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
    }
    started = start_services(env, tmp / "services.log", actions=("get",))
    yield started
    started.stop()


def run_finished(services, run: str) -> dict:
    for line in services.log_path.read_text().splitlines():
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("message") == "run finished" and entry.get("run_id") == run:
            return entry
    raise AssertionError(f"no 'run finished' line for run {run}")


def test_a_get_logs_and_observes_its_phases(services):
    data = {"type": "test", "source": {"n": uuid.uuid4().hex}, "version": {"ref": "p"}}
    event = request_event("get", data)
    status, reply, _ = send(services.urls["get"], event)
    assert status == 200 and reply.get_data()["cached"] is False
    phases = run_finished(
        services, run_of(E2E_CACHE_SECRET, event.get_source(), event.get_id(), "get")
    )["phases"]
    assert {"create", "script", "upload", "store"} <= set(phases)
    assert "stage" not in phases  # a get has no inputs to stage
    assert all(isinstance(seconds, float) and seconds >= 0 for seconds in phases.values())
    for phase in ("create", "script", "upload", "store"):
        count = services.metric("get", "resource_function_run_phase_seconds_count", phase=phase)
        assert count == 1, phase
