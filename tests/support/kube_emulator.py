"""kmock's stateful KubernetesEmulator served over HTTP on 127.0.0.1, with what a real API
server adds on create, for tests that drive the official client without a cluster."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from kmock._internal import enums
from kubernetes import client


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what an API server sets on create (uid, creationTimestamp), and
    watches that can be made to fail with 410 Gone (``gone_watches`` of them)."""

    gone_watches = 0

    async def _handle(self, request: Any) -> Any:
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return await super()._handle(request)

    async def _serve_watch(self, request: Any) -> Any:
        if self.gone_watches > 0:
            self.gone_watches -= 1
            yield b""
            yield {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old",
                },
            }
            return
        async for item in super()._serve_watch(request):
            yield item


@dataclass
class Cluster:
    url: str
    emulator: Emulator

    def requests(self, action: str, plural: str) -> list[Any]:
        return [
            r
            for r in list(self.emulator)
            if r.action == enums.action[action.upper()]
            and r.resource is not None
            and r.resource.plural == plural
        ]

    def live(self, plural: str, name: str) -> dict[str, Any] | None:
        for (resource, _, obj_name), obj in list(self.emulator.objects.items()):
            if resource.plural == plural and obj_name == name and not obj.deleted:
                return dict(obj.raw)
        return None

    def ever(self, plural: str) -> list[dict[str, Any]]:
        """Every object of a kind ever created, by its first version."""
        return [
            dict(obj.history[0].raw)
            for (resource, _, _), obj in list(self.emulator.objects.items())
            if resource.plural == plural
        ]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A KubernetesEmulator served over HTTP on 127.0.0.1, in a thread with its own loop."""
    ready, state = threading.Event(), {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with Emulator() as emulator, kmock.Server(emulator) as server:
            for resource in ("v1/pods", "v1/secrets", "batch/v1/jobs"):
                emulator.resources[resource] = {}  # so lists answer before the first object
            state.update(
                emulator=emulator,
                url=str(server.url).rstrip("/"),
                stop=stop,
                loop=asyncio.get_running_loop(),
            )
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "kmock did not start"
    yield Cluster(state["url"], state["emulator"])
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


def api_client_for(url: str) -> Any:
    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


@pytest.fixture
def api(cluster: Cluster) -> Iterator[Any]:
    api_client = api_client_for(cluster.url)
    yield api_client
    api_client.close()
