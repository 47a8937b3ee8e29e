"""The HTTP layer and the Service in-process: ``create_app(...).test_client()`` with a plain
fake runtime and the file store. No container engine, no cluster, no server: seconds."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from cloudevents.core.bindings.http import (
    to_binary_event,
    to_structured_event,
)

from functions.errors import Unavailable
from functions.ledger import results
from functions.model import Failure, Outcome, Task
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post, reply_of


@pytest.mark.parametrize(
    "encode", [to_binary_event, to_structured_event], ids=["binary", "structured"]
)
def test_a_check_is_answered_with_a_succeeded_event(store: Store, encode: Any) -> None:
    runtime = FakeRuntime(store)
    response = post(make_client(store, "check", runtime), event(subject="main"), encode)
    assert response.status_code == 200
    reply = reply_of(response)
    assert reply.get_type() == "dev.resourcefunctions.check.succeeded"
    assert reply.get_extension("requestid") == "evt-1" and reply.get_subject() == "main"
    assert reply.get_data() == {"versions": [{"ref": "v1"}]}
    assert response.headers["content-type"] == "application/json"
    assert len(runtime.ran) == 1


def test_a_failed_run_is_200_with_a_failed_event(store: Store) -> None:
    failure = Failure(kind="resource_failed", message="exit 1", exit_code=1)
    runtime = FakeRuntime(store, Outcome(action="check", failure=failure))
    response = post(make_client(store, "check", runtime), event())
    assert response.status_code == 200
    reply = reply_of(response)
    assert reply.get_type() == "dev.resourcefunctions.check.failed"
    assert reply.get_data()["error"]["kind"] == "resource_failed"


def test_infrastructure_trouble_is_503(store: Store) -> None:
    runtime = FakeRuntime(store, Unavailable("container engine: down"))
    response = post(make_client(store, "check", runtime), event())
    assert response.status_code == 503
    assert response.get_json()["error"]["kind"] == "unavailable"


@pytest.mark.parametrize(
    ("data", "attributes", "problem"),
    [
        ({"type": "nope", "source": {}}, {}, "nope"),
        ({"type": "mock", "source": "not an object"}, {}, "source"),
        ({"type": "mock", "source": {}}, {"type": "dev.resourcefunctions.get.requested"}, "type"),
        ({"type": "mock", "source": {}}, {"replymode": "later"}, "replymode"),
    ],
    ids=["unknown-type", "source-not-object", "wrong-event-type", "bad-replymode"],
)
def test_an_invalid_request_is_400_with_its_problems_and_runs_nothing(
    store: Store, data: Any, attributes: dict[str, str], problem: str
) -> None:
    runtime = FakeRuntime(store)
    response = post(make_client(store, "check", runtime), event(data=data, **attributes))
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["kind"] == "invalid_request"
    assert any(problem in p for p in error["problems"]), error["problems"]
    assert runtime.ran == [] and runtime.started == []


def test_an_event_without_id_is_400(store: Store) -> None:
    body = json.dumps(
        {
            "specversion": "1.0",
            "type": "dev.resourcefunctions.check.requested",
            "source": "/x",
            "data": {"type": "mock", "source": {}},
        }
    )
    response = make_client(store, "check", FakeRuntime(store)).post(
        "/", data=body, headers={"content-type": "application/cloudevents+json"}
    )
    assert response.status_code == 400


def test_a_redelivered_request_replays_the_stored_reply(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime)
    first, again = post(client, event()), post(client, event())
    assert first.status_code == again.status_code == 200
    assert reply_of(again).get_data() == reply_of(first).get_data()
    assert len(runtime.ran) == 1


def test_a_get_of_a_cached_version_answers_without_a_run(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "get", runtime)
    get = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}
    request = event("get", get)
    first = post(client, request)
    assert first.status_code == 200 and len(runtime.ran) == 1
    task = runtime.ran[0]
    assert task.cache_key
    artifact_key = f"artifacts/{task.cache_key}.tar.zst"
    results.write_once(store, artifact_key, b"bytes")
    record = {
        "version": {"ref": "v1"},
        "metadata": [],
        "artifact": {
            "url": store.url_for(artifact_key),
            "digest": "sha256:" + "0" * 64,
            "size": 5,
            "format": "tar+zstd",
        },
    }
    store_json(store, f"artifacts/{task.cache_key}.json", record)
    hit = post(client, event("get", get, id="evt-2"))
    assert hit.status_code == 200
    assert reply_of(hit).get_data()["cached"] is True
    assert len(runtime.ran) == 1


def store_json(store: Store, key: str, value: Any) -> None:
    from storage import put_json

    put_json(store, key, value)


def test_async_mode_is_202_and_starts_the_task(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime, sink="http://sink.example")
    response = post(client, event(replymode="async"))
    assert response.status_code == 202 and response.data == b""
    assert [t.request_id for t in runtime.started] == ["evt-1"] and runtime.ran == []


def test_async_mode_without_a_sink_is_400(store: Store) -> None:
    response = post(make_client(store, "check", FakeRuntime(store)), event(replymode="async"))
    assert response.status_code == 400


def test_configured_async_without_a_sink_yet_replies_in_the_response(store: Store) -> None:
    """A fresh Knative install serves its first revision before the SinkBinding injects
    K_SINK: REPLY_MODE=async then answers synchronously instead of losing the request."""
    runtime = FakeRuntime(store)
    response = post(make_client(store, "check", runtime, reply_mode="async"), event())
    assert response.status_code == 200
    assert reply_of(response).get_data()["versions"] == [{"ref": "v1"}]
    assert len(runtime.ran) == 1 and runtime.started == []


def test_configured_async_with_a_sink_is_202(store: Store) -> None:
    runtime = FakeRuntime(store)
    client = make_client(store, "check", runtime, reply_mode="async", sink="http://sink.example")
    assert post(client, event()).status_code == 202
    assert len(runtime.started) == 1 and runtime.ran == []


def test_healthz_and_metrics(store: Store) -> None:
    client = make_client(store, "check", FakeRuntime(store))
    assert client.get("/healthz").get_json() == {"status": "ok", "action": "check"}
    post(client, event())
    assert 'status="200"' in client.get("/metrics").get_data(as_text=True)


def structured(body: str) -> dict[str, Any]:
    return {"data": body, "headers": {"content-type": "application/cloudevents+json"}}


def attributes_json(**overrides: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "specversion": "1.0",
        "type": "dev.resourcefunctions.check.requested",
        "source": "/x",
        "id": "evt-9",
        "datacontenttype": "application/json",
        "data": {"type": "mock", "source": {}},
    }
    attrs.update(overrides)
    return {k: v for k, v in attrs.items() if v is not None}


def test_a_binary_event_without_id_is_400(store: Store) -> None:
    runtime = FakeRuntime(store)
    message = to_binary_event(event())
    headers = {k: v for k, v in message.headers.items() if k.lower() != "ce-id"}
    response = make_client(store, "check", runtime).post("/", headers=headers, data=message.body)
    assert response.status_code == 400 and "no id" in response.get_json()["error"]["message"]
    assert runtime.ran == []


@pytest.mark.parametrize("body", ["[]", '"x"', "17", "null", "[1, {}]"])
def test_a_structured_body_that_is_not_a_json_object_is_400(store: Store, body: str) -> None:
    runtime = FakeRuntime(store)
    response = make_client(store, "check", runtime).post("/", **structured(body))
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.get_json()["error"]["kind"] == "invalid_request"
    assert runtime.ran == []


def nested(levels: int) -> Any:
    return json.loads('{"a":' * levels + '"leaf"' + "}" * levels)


@pytest.mark.parametrize("levels", [65, 200, 970])
@pytest.mark.parametrize("field", ["source", "params", "version"])
def test_nesting_deeper_than_64_levels_is_400(store: Store, levels: int, field: str) -> None:
    runtime = FakeRuntime(store)
    data = {"type": "mock", "source": {}, "version": {"ref": "1"}, field: "DEEP"}
    deep = '{"a":' * levels + '"leaf"' + "}" * levels  # too deep for the SDK's encoder
    body = json.dumps(data).replace('"DEEP"', deep)
    message = to_binary_event(event("get"))
    response = make_client(store, "get", runtime).post(
        "/", headers=dict(message.headers), data=body
    )
    assert response.status_code == 400
    problems = response.get_json()["error"]["problems"]
    assert any(
        f"'{field}' is nested deeper than 64" in p or "nested too deeply" in p for p in problems
    ), problems
    assert runtime.ran == []


def test_nesting_of_64_levels_runs(store: Store) -> None:
    runtime = FakeRuntime(store)
    response = post(
        make_client(store, "check", runtime), event(data={"type": "mock", "source": nested(64)})
    )
    assert response.status_code == 200 and len(runtime.ran) == 1


@pytest.mark.parametrize("attribute", ["id", "subject", "source"])
def test_an_attribute_with_a_lone_surrogate_is_400(store: Store, attribute: str) -> None:
    runtime = FakeRuntime(store)
    body = json.dumps(attributes_json(**{attribute: "bad\ud800id"}))
    response = make_client(store, "check", runtime).post("/", **structured(body))
    assert response.status_code == 400
    assert "lone surrogate" in response.get_json()["error"]["message"]
    assert runtime.ran == []


def put_data(inputs: Any) -> dict[str, Any]:
    return {"type": "mock", "source": {}, "inputs": inputs}


def test_unknown_fields_inside_an_input_object_are_400(store: Store) -> None:
    runtime = FakeRuntime(store)
    url = store.url_for("artifacts/" + "b" * 64 + ".tar.zst")
    spec = {"url": url, "digest": "sha256:" + "c" * 64, "extra": 1}
    response = post(make_client(store, "put", runtime), event("put", put_data({"in": spec})))
    assert response.status_code == 400
    assert "unknown field(s) 'extra'" in response.get_json()["error"]["message"]
    assert runtime.ran == []


def test_more_than_64_inputs_are_400(store: Store) -> None:
    runtime = FakeRuntime(store)
    url = store.url_for("artifacts/" + "b" * 64 + ".tar.zst")
    inputs = {f"in{i}": url for i in range(65)}
    response = post(make_client(store, "put", runtime), event("put", put_data(inputs)))
    assert response.status_code == 400 and "at most 64 inputs" in response.get_data(as_text=True)
    assert runtime.ran == []


def test_a_request_that_joined_another_run_gets_its_own_result_record(store: Store) -> None:
    release, entered = threading.Event(), threading.Event()

    class BlockingRuntime(FakeRuntime):
        def run(self, task: Task) -> Outcome:
            entered.set()
            release.wait(10)
            return super().run(task)

    runtime = BlockingRuntime(store)
    client = make_client(store, "check", runtime)
    first = threading.Thread(target=post, args=(client, event(id="leader")))
    first.start()
    assert entered.wait(10)
    joiner = threading.Thread(target=post, args=(client, event(id="joiner")))
    joiner.start()
    time.sleep(0.3)  # the joiner reaches the leader's flight (same source, same check)
    release.set()
    first.join(10)
    joiner.join(10)
    assert len(runtime.ran) == 1
    again = post(client, event(id="joiner"))  # the joiner's redelivery replays, runs nothing
    assert again.status_code == 200 and len(runtime.ran) == 1
    assert reply_of(again).get_data() == {"versions": [{"ref": "v1"}]}
