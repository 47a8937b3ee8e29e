"""``/readyz`` against the container engine: Podman answers; an engine that is not there
does not, and says so."""

from __future__ import annotations

from pathlib import Path

from functions.cli.launch import free_port
from functions.http.readiness import Readiness
from functions.runtimes.local.container import ContainerRuntime
from functions.settings import Settings
from storage import Store, open_store


def container_runtime(store: Store, docker_host: str) -> ContainerRuntime:
    settings = Settings(store_url=store.url, engine_env={"DOCKER_HOST": docker_host})
    return ContainerRuntime.from_settings(settings, store)


def test_the_container_engine_answers(tmp_path: Path, docker_host: str) -> None:
    store = open_store(tmp_path.as_uri())
    runtime = container_runtime(store, docker_host)
    try:
        assert Readiness(store, runtime).probe()[0] == 200
    finally:
        runtime.close()


def test_an_engine_that_is_not_there_is_not_ready(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    runtime = container_runtime(store, f"tcp://127.0.0.1:{free_port()}")
    try:
        status, body = Readiness(store, runtime).probe()
    finally:
        runtime.close()
    assert status == 503
    assert body["runtime"].startswith("Unavailable: the container engine does not answer")
