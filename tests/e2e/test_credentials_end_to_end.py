"""((var)) references end to end on the local runtime: real services under gunicorn, real
containers under Podman, CREDENTIALS_DIR as the provider. The script runs with the resolved
values, and the values appear nowhere else: not in the event, the replies, the services' log
or the store (short values included: resolved values are redacted whatever their length)."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.engine import service_env
from tests.support.events import request_event, send
from tests.support.services import CANARY, start_services

SHORT = "fail"  # a 4-character credential: literal values this short are not redacted


@pytest.fixture(scope="module")
def deployment(docker_host, resource_image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("creds")
    creds = tmp / "credentials"
    (creds / "teams" / "main" / "git").mkdir(parents=True)
    (creds / "teams" / "main" / "git" / "password").write_text(CANARY + "\n")
    (creds / "shared").mkdir()
    (creds / "shared" / "mode").write_text(SHORT + "\n")
    env = {
        **service_env(docker_host, resource_image, tmp),
        "CACHE_SECRET": "e2e-cache-secret",
        "LOG_LEVEL": "debug",
        "CREDENTIALS_DIR": str(creds),
        "ALLOWED_IMAGES": "",
    }
    services = start_services(env, tmp / "services.log", actions=("check", "get"))
    try:
        yield services, tmp / "store"
    finally:
        services.stop()


BUILD = {"team": "main", "pipeline": "p", "id": "1"}


def test_a_check_runs_with_the_resolved_values_which_are_redacted(deployment):
    services, _ = deployment
    event = request_event(
        "check",
        {
            "type": "test",
            "build": BUILD,
            "source": {"mode": "((mode))", "password": "((git.password))"},
        },
    )
    assert CANARY not in json.dumps(event.get_data())
    status, reply, response = send(services.urls["check"], event)
    assert status == 200, response.text
    error = reply.get_data()["error"]
    # mode=fail reached the script: it failed as that mode does, exit code 3
    assert error["kind"] == "resource_failed" and error["exit_code"] == 3
    assert "mode=[redacted] password=[redacted]" in error["log_tail"]
    assert SHORT not in error["log_tail"] and CANARY not in response.text


def test_a_get_by_reference_and_by_the_same_literal_value_share_the_cache(deployment):
    services, _ = deployment
    by_ref = {"uri": "https://git.example.com/r.git", "password": "((git.password))"}
    data = {"type": "test", "build": BUILD, "version": {"ref": "1"}, "source": by_ref}
    status, first, response = send(services.urls["get"], request_event("get", data))
    assert status == 200, response.text
    assert first.get_type() == "dev.resourcefunctions.get.succeeded"
    assert first.get_data()["cached"] is False and CANARY not in response.text
    literal = {**data, "source": {**by_ref, "password": CANARY}}
    status, second, _ = send(services.urls["get"], request_event("get", literal))
    assert second.get_data()["cached"] is True
    assert second.get_data()["artifact"] == first.get_data()["artifact"]


def test_unresolvable_references_and_disallowed_images_are_400(deployment, resource_image):
    services, _ = deployment
    status, _, response = send(
        services.urls["check"],
        request_event(
            "check", {"type": "test", "build": {"team": "other"}, "source": {"p": "((nope.key))"}}
        ),
    )
    assert status == 400 and "((nope.key)) cannot be resolved" in response.text
    status, _, response = send(
        services.urls["check"], request_event("check", {"image": resource_image, "source": {}})
    )
    assert status == 400 and "ALLOWED_IMAGES" in response.text


def test_resolved_values_appear_nowhere(deployment):
    services, store = deployment
    time.sleep(0.5)  # the services' last log lines
    assert CANARY not in services.log_path.read_text()
    for path in store.rglob("*"):
        if path.is_file():
            body = path.read_bytes()
            assert CANARY.encode() not in body, path
            if path.parent.name == "logs":
                assert b"mode=" + SHORT.encode() not in body, path
