"""The container engine and the service as the e2e tests see them: the service's environment
for a store in a directory, and the task containers of a run, by its label."""

from __future__ import annotations

from typing import Any

import docker

from functions.cli.launch import wait_until
from tests.support.services import resource_types


def service_env(docker_host: str, image: str, tmp_path) -> dict[str, str]:
    (tmp_path / "store").mkdir(exist_ok=True)
    return {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": resource_types(image),
        "CACHE_SECRET": "e2e",
        "STORE_URL": (tmp_path / "store").as_uri(),
        "WORK_DIR": str(tmp_path),
        # One container per run, named after it (adopted by a redelivery, swept): what these
        # tests look at; tests/e2e/test_warm_checks.py turns reuse on.
        "WARM_CHECKS": "off",
    }


def containers_of(docker_host: str, run: str, **filters: str) -> list[Any]:
    return docker.DockerClient(base_url=docker_host).containers.list(
        all=True, filters={"label": f"run-id={run}", **filters}
    )


def wait_running(docker_host: str, run: str) -> None:
    wait_until(
        lambda: containers_of(docker_host, run, status="running"),
        "the run's container running",
        60,
        interval=0.2,
    )
