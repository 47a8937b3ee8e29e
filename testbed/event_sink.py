"""A real HTTP server on loopback that records the CloudEvents POSTed to it (a K_SINK)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from cloudevents.core.v1.event import CloudEvent


@dataclass
class EventSink:
    url: str
    received: queue.Queue[CloudEvent] = field(default_factory=queue.Queue)
    bodies: list[bytes] = field(default_factory=list)  # raw, to look for leaked secrets
    status: int = 202  # what it answers; set >= 300 to refuse

    def drain(self) -> list[CloudEvent]:
        """The events received so far, in order."""
        events = []
        while not self.received.empty():
            events.append(self.received.get_nowait())
        return events


@contextmanager
def event_sink() -> Iterator[EventSink]:
    sink = EventSink(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if sink.status < 300:
                sink.bodies.append(str(self.headers).encode() + body)
                sink.received.put(from_http_event(HTTPMessage(dict(self.headers), body)))
            self.send_response(sink.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
