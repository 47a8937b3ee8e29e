"""Tracing through the real service: the request's traceparent comes back on the reply and
reaches the script's env; with OTEL_EXPORTER_OTLP_ENDPOINT set, the run and its phases are
exported as spans (OTLP over HTTP) to a receiver started here, children of the request's."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.events import request_event, send
from tests.support.runs import run_of
from tests.support.services import E2E_CACHE_SECRET, resource_types, start_services

TRACE_ID = uuid.uuid4().hex
PARENT_ID = uuid.uuid4().hex[:16]
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP trace receiver: keeps every span it is sent, with its service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    names = [
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ]
                    for scope in resource_spans.scope_spans:
                        receiver.spans += [(names[0] if names else "", s) for s in scope.spans]
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str, count: int, seconds: float = 30) -> list[tuple[str, Any]]:
        """The spans of a trace, once at least ``count`` have come (batched export)."""
        deadline = time.monotonic() + seconds
        while True:
            found = [(name, s) for name, s in self.spans if s.trace_id.hex() == trace_id]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


@pytest.fixture(scope="module")
def traced(docker_host, resource_image, tmp_path_factory) -> Iterator[tuple[Any, Receiver]]:
    receiver = Receiver()
    tmp = tmp_path_factory.mktemp("tracing")
    (tmp / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": resource_types(resource_image),
        "CACHE_SECRET": E2E_CACHE_SECRET,
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after the run
    }
    services = start_services(env, tmp / "services.log", actions=("check",))
    yield services, receiver
    services.stop()
    receiver.server.shutdown()


def test_a_check_carries_the_trace_and_exports_its_spans(traced):
    services, receiver = traced
    event = request_event(
        "check", {"type": "test", "source": {"count": 1}}, traceparent=TRACEPARENT
    )
    status, reply, _ = send(services.urls["check"], event)
    assert status == 200 and reply.get_data()["versions"] == [{"ref": "1"}]
    assert reply.get_extension("traceparent") == TRACEPARENT
    run = run_of(E2E_CACHE_SECRET, event.get_source(), event.get_id(), "check")
    store = services.env["STORE_URL"].removeprefix("file://")
    with open(f"{store}/logs/{run}.log") as log:
        assert f"traceparent={TRACEPARENT}" in log.read()  # the script saw it in its env

    spans = receiver.of_trace(TRACE_ID, count=4)
    runs = [s for _, s in spans if s.name == "check run"]
    assert len(runs) == 1 and runs[0].parent_span_id.hex() == PARENT_ID
    assert {name for name, _ in spans} == {"resource-functions-check"}
    attributes = {a.key: a.value.string_value for a in runs[0].attributes}
    assert attributes["resource_functions.run_id"] == run
    assert attributes["resource_functions.outcome"] == "succeeded"
    phases = {s.name for _, s in spans if s.parent_span_id == runs[0].span_id}
    assert {"create", "script", "store"} <= phases
