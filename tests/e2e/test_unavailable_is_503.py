"""Infrastructure trouble answers 503 (Knative redelivers); nothing is half-recorded."""

from __future__ import annotations

import pytest

from tests.support.events import request_event, send
from tests.support.services import resource_types, start_services


@pytest.fixture
def broken(request, resource_image, tmp_path):
    services = start_services(
        request.param(tmp_path, resource_image, request), tmp_path / "log", actions=("check",)
    )
    yield services
    services.stop()


def missing_bucket(tmp_path, image, request):
    server = request.getfixturevalue("s3_endpoint")
    env = {k: v for k, v in server.env.items() if v is not None}
    return {
        **env,
        "STORE_URL": "s3://rf-no-such-bucket-here/x",
        "RESOURCE_TYPES": resource_types(image),
        "DOCKER_HOST": request.getfixturevalue("docker_host"),
    }


def engine_down(tmp_path, image, request):
    (tmp_path / "store").mkdir()
    return {
        "STORE_URL": (tmp_path / "store").as_uri(),
        "RESOURCE_TYPES": resource_types(image),
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
    }


@pytest.mark.parametrize(
    "broken, detail",
    [
        pytest.param(missing_bucket, "rf-no-such-bucket-here", id="store-bucket-missing"),
        pytest.param(engine_down, "container engine", id="engine-unreachable"),
    ],
    indirect=["broken"],
)
def test_infrastructure_failure_answers_503_with_reason(broken, detail):
    status, _, response = send(
        broken.urls["check"], request_event("check", {"type": "test", "source": {}})
    )
    assert status == 503
    error = response.json()["error"]
    assert error["kind"] == "unavailable" and detail in error["message"]
