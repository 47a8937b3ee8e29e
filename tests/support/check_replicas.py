"""Check-service replicas for the lease tests: separate Service objects (each with its own
store client and in-process single flight, as separate replicas have) on one store, and a
check request sent to one of them through its HTTP layer."""

from __future__ import annotations

from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event, to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions import keys
from functions.http.app import create_app
from functions.model import ResourceType
from functions.runtimes import Runtime
from functions.settings import Settings
from storage import StoreOptions, open_store

IMAGE = "example.org/git-resource@sha256:" + "b" * 64
SECRET = b"k" * 32
SOURCE = {"uri": "https://example.org/repo.git"}
# The lease record of the repository these checks check.
LEASE_KEY = keys.lease_record_key(keys.resource_key(SECRET, image=IMAGE, source=SOURCE, team=""))


def replicas(store_url: str, runtime: Runtime, n: int, **settings: Any) -> list[Any]:
    """``n`` check services (Flask test clients) on one store and one runtime."""
    config = Settings(
        store_url=store_url,
        resource_types={"git": ResourceType(image=IMAGE)},
        cache_secret=SECRET,
        check_lease_seconds=30,
        **settings,
    )
    return [
        create_app(
            config, "check", store=open_store(store_url, StoreOptions()), runtime=runtime
        ).test_client()
        for _ in range(n)
    ]


def check(client: Any, event_id: str, **data: Any) -> tuple[int, dict[str, Any]]:
    """Send a check of the one repository; the status and, for a 200, the reply's data."""
    request = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.resourcefunctions.check.requested",
            "source": "/tests/replicas",
            "id": event_id,
            "datacontenttype": "application/json",
        },
        data={"type": "git", "source": SOURCE, **data},
    )
    return send(client, request)


def send(client: Any, event: CloudEvent) -> tuple[int, dict[str, Any]]:
    """POST ``event`` to a service's test client: the status and, for a 200, the reply's data."""
    message = to_binary_event(event)
    response = client.post("/", headers=dict(message.headers), data=message.body)
    if response.status_code != 200:
        return response.status_code, {}
    reply = from_http_event(HTTPMessage(headers=dict(response.headers), body=response.data))
    return response.status_code, reply.get_data()
