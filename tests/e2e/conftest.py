"""Real services for end-to-end tests: Podman's Docker-compatible API, the test resource
image, and the check/get/put services under gunicorn on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from testbed.podman import podman_service
from testbed.process import free_port
from tests.images import build_test_resource

REPO = Path(__file__).resolve().parents[2]
CANARY = "canary-7d3f9b2e-do-not-leak"
E2E_CACHE_SECRET = "e2e-cache-secret"


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
class Services:
    """The three services of one deployment, started as real processes."""

    urls: dict[str, str]
    log_path: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def metric(self, action: str, name: str, **labels: str) -> float:
        text = requests.get(self.urls[action] + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_services(
    env_overrides: dict[str, str],
    log_path: Path,
    actions=("check", "get", "put"),
    host: str = "127.0.0.1",
) -> Services:
    env = {k: v for k, v in os.environ.items() if not k.startswith("K_")}
    env.update({"RUNTIME": "container"})  # the local runtime unless a test says otherwise
    env.update(env_overrides)
    env["PYTHONPATH"] = str(REPO)
    services = Services(urls={}, log_path=log_path, env=env)
    log = open(log_path, "ab")  # noqa: SIM115 (the children write to it until stop())
    for action in actions:
        port = free_port(host)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "functions",
                "serve",
                action,
                "--host",
                host,
                "--port",
                str(port),
            ],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
        services.procs.append(proc)
        services.urls[action] = f"http://{host}:{port}"
    for action, proc in zip(actions, services.procs, strict=True):
        url = services.urls[action]
        _wait_for(lambda url=url: _healthy(url), proc, f"{action} service", log_path)
    return services


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=1).status_code == 200
    except (requests.ConnectionError, requests.Timeout):  # bound, worker not up yet: again
        return False


def _wait_for(ready, proc, what, log_path: Path | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            output = log_path.read_text() if log_path else proc.stdout.read().decode()
            pytest.fail(f"{what} exited with {proc.returncode}:\n{output[-4000:]}")
        time.sleep(0.1)
    pytest.fail(f"{what} not ready after {timeout}s")


def resource_types(image: str, registry: str = "") -> str:
    """The test catalogue; ``registry``: the stub, whose "nope" image is unknown to it."""
    return json.dumps(
        {
            "test": image,
            "slow": {"image": image, "timeout_seconds": 3},
            "missing": f"{registry}/nope:1" if registry else "localhost/rf-no-such-image:1",
        }
    )


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
