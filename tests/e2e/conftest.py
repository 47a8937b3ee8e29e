"""Real services for end-to-end tests: Podman's Docker-compatible API, the test resource
image, and the check/get/put services under gunicorn on loopback."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass

import pytest

from testbed.podman import podman_service
from tests.support.images import build_test_resource
from tests.support.services import E2E_CACHE_SECRET, Services, resource_types, start_services


@pytest.fixture(scope="session")
def registry():
    """A registry that is down, busy or refusing on demand (``testbed/registry_stub.py``):
    the "missing" type's image is one it does not know."""
    from testbed.registry_stub import registry_stub

    with registry_stub() as address:
        yield address


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory, registry):
    """DOCKER_HOST of a container engine: the given one, or a Podman API service we start,
    which may pull from the stub registry over plain HTTP."""
    if os.environ.get("DOCKER_HOST"):
        yield os.environ["DOCKER_HOST"]
        return
    if not shutil.which("podman"):
        pytest.fail("podman is not installed and DOCKER_HOST is not set (run .ci/setup)")
    root = tmp_path_factory.mktemp("podman")
    sock = root / "podman.sock"
    host = f"unix://{sock}"
    conf = root / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    env = {**os.environ, "CONTAINERS_REGISTRIES_CONF": str(conf)}
    proc = podman_service(sock, root / "podman.log", env)
    yield host
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def resource_image():
    return build_test_resource()


@dataclass
class Deployment:
    """The services of one store backend, and a client view of that store."""

    backend: str
    services: Services
    store: object
    started: float


@pytest.fixture(scope="module", params=["file", "s3", "gcs"])
def deployment(request, docker_host, resource_image, registry, tmp_path_factory):
    """check/get/put services on one backend (ids file, s3, gcs), for the test module."""
    from storage import open_store

    backend = request.param
    tmp = tmp_path_factory.mktemp(f"deploy-{backend}")
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": resource_types(resource_image, registry),
        "CACHE_SECRET": E2E_CACHE_SECRET,
        "LOG_LEVEL": "debug",
        "WORK_DIR": str(tmp),
    }
    if backend == "file":
        (tmp / "store").mkdir()
        env["STORE_URL"] = (tmp / "store").as_uri()
    else:
        server = request.getfixturevalue(f"{backend}_endpoint")
        bucket = request.getfixturevalue(f"{backend}_bucket")
        env.update({k: v for k, v in server.env.items() if v is not None})
        scheme = "s3" if backend == "s3" else "gs"
        env["STORE_URL"] = f"{scheme}://{bucket}/e2e-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        store = open_store(env["STORE_URL"])
        services = start_services(env, tmp / "services.log")
        try:
            yield Deployment(backend, services, store, time.time() - 1)
        finally:
            services.stop()
