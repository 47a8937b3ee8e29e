"""A real HTTP server that records the CloudEvents POSTed to it (either content mode), in
arrival order: a K_SINK on loopback, or on the cluster's gateway for the Broker's replies.
The one sink of the tests and the benches (the ``sink`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from cloudevents.core.v1.event import CloudEvent


@dataclass
class EventSink:
    url: str
    bodies: list[bytes] = field(default_factory=list)  # raw, to look for leaked secrets
    peers: list[tuple[str, int]] = field(default_factory=list)  # each connection's client
    status: int = 202  # what it answers; set >= 300 to refuse
    retry_after: str = ""  # sent as Retry-After with a refusal, if set
    attempts: list[float] = field(default_factory=list)  # every POST's arrival, refused too
    # Seconds to hold an event's POST before answering (a slow Broker), by the event.
    hold: Callable[[CloudEvent], float] | None = None
    _arrived: list[tuple[float, CloudEvent]] = field(default_factory=list)
    _drained: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def receive(self, event: CloudEvent, raw: bytes) -> None:
        with self._changed:
            self.bodies.append(raw)
            self._arrived.append((time.monotonic(), event))
            self._changed.notify_all()

    @property
    def events(self) -> list[CloudEvent]:
        """Every event received so far, in order."""
        with self._changed:
            return [event for _, event in self._arrived]

    def drain(self) -> list[CloudEvent]:
        """The events received since the last ``drain`` (or ``next``), in order."""
        with self._changed:
            fresh = [event for _, event in self._arrived[self._drained :]]
            self._drained = len(self._arrived)
            return fresh

    def next(self, timeout: float = 60) -> CloudEvent:
        """The next event not drained yet, waiting for it up to ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._arrived) > self._drained, timeout):
                raise AssertionError(f"no event within {timeout} s; {self._last_seen()}")
            self._drained += 1
            return self._arrived[self._drained - 1][1]

    def matching(self, **attributes: object) -> list[CloudEvent]:
        """The events whose attributes (extensions included) have these values."""
        with self._changed:
            return self._matching(attributes)

    def wait(self, timeout: float = 120, count: int = 1, **attributes: object) -> list[CloudEvent]:
        """The events ``matching`` these attributes, once there are ``count`` of them."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: len(self._matching(attributes)) >= count, timeout
            ):
                raise AssertionError(
                    f"no {count} event(s) with {attributes} within {timeout} s; "
                    + self._last_seen()
                )
            return self._matching(attributes)

    def arrival(self, event: CloudEvent) -> float:
        """When ``event`` arrived (``time.monotonic``)."""
        with self._changed:
            return next(at for at, seen in self._arrived if seen is event)

    def _matching(self, attributes: dict[str, object]) -> list[CloudEvent]:
        return [
            event
            for _, event in self._arrived
            if all(event.get_attributes().get(k) == v for k, v in attributes.items())
        ]

    def _last_seen(self) -> str:
        seen = [
            (event.get_type(), event.get_attributes().get("requestid"))
            for _, event in self._arrived[-20:]
        ]
        return f"last seen (type, requestid): {seen}"


@contextmanager
def event_sink(host: str = "127.0.0.1") -> Iterator[EventSink]:
    sink = EventSink(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the Broker's ingress

        def setup(self) -> None:
            super().setup()
            sink.peers.append(self.client_address)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            sink.attempts.append(time.monotonic())
            status = sink.status
            if status < 300:
                event = from_http_event(HTTPMessage(dict(self.headers), body))
                sink.receive(event, str(self.headers).encode() + body)
                if sink.hold is not None:
                    time.sleep(sink.hold(event))
            self.send_response(status)
            if status >= 300 and sink.retry_after:
                self.send_header("Retry-After", sink.retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    sink.url = f"http://{host}:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
