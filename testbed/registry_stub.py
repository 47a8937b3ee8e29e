"""A registry that is down, busy or refusing, on demand: an HTTP server speaking the start of
the OCI distribution API (``/v2/`` answers, every manifest request gets the status its
repository's name asks for). No real registry answers 503 or 429 when told to, so the
image-pull rule (``functions.errors.pull_is_transient``) is tested against this one, by the
real engines' pulls (Podman's, containerd's through the kubelet).

    down    503 Service Unavailable          busy     429 Too Many Requests
    nope    404 MANIFEST_UNKNOWN             locked   401 UNAUTHORIZED
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERS = {
    "down": (503, None),
    "busy": (429, None),
    "nope": (404, {"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}),
    "locked": (401, {"code": "UNAUTHORIZED", "message": "authentication required"}),
}


class _Registry(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def _answer(self) -> None:
        if self.path.rstrip("/") == "/v2":
            self._send(200, b"{}", {"Docker-Distribution-API-Version": "registry/2.0"})
            return
        parts = self.path.split("/")
        status, error = ANSWERS.get(parts[2] if len(parts) > 2 else "", ANSWERS["nope"])
        body = json.dumps({"errors": [error]}).encode() if error else b""
        self._send(status, body, {"Content-Type": "application/json"})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def registry_stub(host: str = "127.0.0.1") -> Iterator[str]:
    """The stub's address (``host:port``) for the duration of the block."""
    server = ThreadingHTTPServer((host, 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
