"""What the fast tier's tests of the HTTP layer and the Service share: a fake runtime that
records what it ran (and stores its outcome, as every runtime must), the test client of
``create_app``, request events built with the SDK, and posting them."""

from __future__ import annotations

from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event, to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.errors import Unavailable
from functions.http.app import create_app
from functions.ledger import results
from functions.model import Outcome, ResourceType, Task
from functions.runtimes.warm.pool import WarmCounts
from functions.settings import Settings
from storage import Store, put_json

IMAGE = "example.org/mock-resource@sha256:" + "a" * 64


class FakeRuntime:
    """Answers ``run`` with a scripted outcome and records it, as every runtime must."""

    def __init__(self, store: Store, outcome: Outcome | Exception | None = None) -> None:
        self.store = store
        self.outcome = outcome
        self.ran: list[Task] = []
        self.started: list[Task] = []
        self.stopped: list[tuple[str, str]] = []  # (run, action) of each stop
        self.unready = ""  # set: ready() raises Unavailable with it (the engine is down)
        self.adopting = True  # False: as warm checks, a run started twice runs twice

    def run(self, task: Task) -> Outcome:
        self.ran.append(task)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        outcome = self.outcome or Outcome(action=task.action, data=_data(task))
        return results.record_outcome(self.store, task.run_id, outcome, request=task.request_digest)

    def start(self, task: Task, ended: Any = None) -> None:
        self.started.append(task)

    def stop(self, run: str, action: str) -> None:
        self.stopped.append((run, action))

    def tasks_waiting(self) -> int:
        return 0

    def ready(self) -> None:
        if self.unready:
            raise Unavailable(self.unready)

    def warm_counts(self) -> WarmCounts:
        return WarmCounts()

    def adopts(self, task: Task) -> bool:
        return self.adopting

    def close(self) -> None:
        pass


def _data(task: Task) -> dict[str, Any]:
    if task.action == "check":
        return {"versions": [{"ref": "v1"}]}
    return {"version": {"ref": "v1"}, "metadata": []}


def make_client(
    store: Store, action: str, runtime: FakeRuntime, senders: Any = None, **settings: Any
) -> Any:
    config = Settings(
        store_url=store.url,
        resource_types={"mock": ResourceType(image=IMAGE)},
        cache_secret=b"k" * 32,
        **settings,
    )
    app = create_app(config, action, store=store, runtime=runtime, senders=senders)  # type: ignore[arg-type]
    return app.test_client()


def event(action: str = "check", data: Any = None, **attributes: Any) -> CloudEvent:
    attrs = {
        "specversion": "1.0",
        "type": f"dev.resourcefunctions.{action}.requested",
        "source": "/ci/pipeline",
        "id": "evt-1",
        "datacontenttype": "application/json",
    }
    attrs.update(attributes)
    return CloudEvent(
        attributes=attrs, data={"type": "mock", "source": {"uri": "x"}} if data is None else data
    )


def post(
    client: Any, request: CloudEvent, encode: Any = to_binary_event, headers: Any = None
) -> Any:
    message = encode(request)
    return client.post("/", headers={**message.headers, **(headers or {})}, data=message.body)


def reply_of(response: Any) -> CloudEvent:
    return from_http_event(HTTPMessage(headers=dict(response.headers), body=response.data))


RECORD = {"version": {"ref": "v1"}, "metadata": []}


def cache_entry(store: Store, cache_key: str) -> str:
    """Store an artifact and its cache record, as a get's collect does; return the key."""
    key = f"artifacts/{cache_key}.tar.zst"
    results.write_once(store, key, b"bytes")
    artifact = {"url": store.url_for(key), "digest": "sha256:" + "0" * 64, "size": 5}
    put_json(store, f"artifacts/{cache_key}.json", {**RECORD, "artifact": artifact})
    return key


GIT_IMAGE = "example.org/git-resource@sha256:" + "a" * 64


def check_client(store: Store, runtime: Any, sink: str = "", **type_settings: Any) -> Any:
    """The check service on ``store`` and ``runtime`` (a ``RepositoryRuntime``), with a "git"
    type and ``sink`` as K_SINK."""
    settings = Settings(
        store_url=store.url,
        resource_types={"git": ResourceType(image=GIT_IMAGE, **type_settings)},
        cache_secret=b"k" * 32,
        sink=sink,
    )
    return create_app(settings, "check", store=store, runtime=runtime).test_client()  # type: ignore[arg-type]
