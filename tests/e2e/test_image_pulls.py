"""The image-pull rule on the local runtime, with Podman's real pulls from a registry that is
down, busy or refusing (``testbed/registry_stub.py``): a registry answering 503 or 429
is trouble that may pass (the request is answered 503 and redelivered, nothing recorded); an
unknown image, or one the registry refuses, fails at once (200 + ``image_pull``). The
Kubernetes runtime applies the same rule to the kubelet's words
(``tests/fast/test_failure_classification.py``, ``tests/cluster``)."""

from __future__ import annotations

import json
import uuid

import pytest

from testbed.podman import podman_service
from testbed.registry_stub import registry_stub
from tests.support.events import request_event, send
from tests.support.runs import run_of
from tests.support.services import start_services


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    """The check service on a Podman API service of its own, whose registries.conf lets it
    pull from the stub over plain HTTP (as an insecure registry)."""
    tmp = tmp_path_factory.mktemp("pulls")
    with registry_stub() as registry:
        conf = tmp / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
        sock = tmp / "podman.sock"
        env = {"CONTAINERS_REGISTRIES_CONF": str(conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        engine = podman_service(sock, tmp / "podman.log", env)
        (tmp / "store").mkdir()
        types = {name: f"{registry}/{name}:1" for name in ("down", "busy", "nope", "locked")}
        env = {
            "DOCKER_HOST": f"unix://{sock}",
            "RESOURCE_TYPES": json.dumps(types),
            "STORE_URL": (tmp / "store").as_uri(),
            "CACHE_SECRET": "e2e-pulls",
            "WORK_DIR": str(tmp),
        }
        running = start_services(env, tmp / "services.log", actions=("check",))
        try:
            yield running, tmp / "store"
        finally:
            running.stop()
            engine.terminate()
            engine.wait(10)


@pytest.mark.parametrize("name", ["down", "busy"])
def test_a_registry_that_is_down_or_busy_is_retried_and_nothing_is_recorded(services, name):
    running, store = services
    event = request_event("check", {"type": name, "source": {"n": uuid.uuid4().hex}})
    status, _, response = send(running.urls["check"], event)
    assert status == 503, response.text
    assert "cannot pull image" in response.json()["error"]["message"]
    run = run_of("e2e-pulls", event.get_source(), event.get_id(), "check")
    assert not (store / "results" / f"{run}.json").exists()  # its redelivery pulls again


@pytest.mark.parametrize(
    ("name", "said"), [("nope", "manifest unknown"), ("locked", "unauthorized")]
)
def test_an_unknown_or_refused_image_fails_at_once(services, name, said):
    running, _ = services
    status, reply, response = send(
        running.urls["check"],
        request_event("check", {"type": name, "source": {"n": uuid.uuid4().hex}}),
    )
    assert status == 200, response.text
    error = reply.get_data()["error"]
    assert error["kind"] == "image_pull" and said in error["message"], error
