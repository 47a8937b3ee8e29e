"""A repository the test resource checks, served on the gateway: the number of its versions
(its ``count_url``), which grows as it gets commits, and how often each check script read it."""

from __future__ import annotations

from collections import Counter as Tally
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

from testbed.kubernetes import GATEWAY


class Counter:
    """A number served over HTTP on the gateway: the test resource's "repository" (its check
    reads the number of versions from ``count_url``), which gets a commit when it grows. Each
    check script reads it once: ``reads(url)`` counts the runs that read ``url`` (one of
    ``url_for``'s), whatever ran them (a Job or a warm pod)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.paths: Tally[str] = Tally()
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                counter.paths[self.path] += 1
                body = str(counter.value).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((GATEWAY, 0), Handler)
        self.url = self.url_for("count")
        Thread(target=self.server.serve_forever, daemon=True).start()

    def url_for(self, name: str) -> str:
        return f"http://{GATEWAY}:{self.server.server_address[1]}/{name}"

    def reads(self, url: str) -> int:
        return self.paths["/" + url.rsplit("/", 1)[1]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
