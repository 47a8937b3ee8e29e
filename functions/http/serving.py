"""Running a service under gunicorn (a production WSGI server).

One worker process with many threads: runs in flight and the single-flight registry live in
that process, and each request mostly waits on a container, a Job or the store.
"""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.app.base import BaseApplication

from functions.events import MAX_BODY_BYTES

# After SIGTERM (or Ctrl-C) the worker finishes the requests under way, then drains: runs in
# flight end and the container removals they queued are done, each removal taking well under
# a second. Past this, gunicorn kills the worker; whatever it left, the next start sweeps.
GRACEFUL_TIMEOUT_SECONDS = 30
# A request body must arrive within this time: a client that stalls mid-body gets 408 and
# its request thread back (gthread reads bodies in the request thread, without a timeout).
BODY_TIMEOUT_SECONDS = 5.0


class BoundedBody:
    """WSGI middleware: read the whole body under a deadline before the app runs."""

    def __init__(self, app: Any, timeout: float = BODY_TIMEOUT_SECONDS) -> None:
        self.app = app
        self.timeout = timeout

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        sock = environ.get("gunicorn.socket")
        length = environ.get("CONTENT_LENGTH") or ""
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if sock is None or not (chunked or (length.isdigit() and int(length) > 0)):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        limit = min(int(length), MAX_BODY_BYTES + 1) if length.isdigit() else MAX_BODY_BYTES + 1
        body = self._read(environ["wsgi.input"], sock, limit)
        if body is None:
            start_response(
                "408 Request Timeout",
                [("Content-Type", "application/json"), ("Connection", "close")],
            )
            return [b'{"error": {"kind": "invalid_request", "message": "request body timed out"}}']
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)  # type: ignore[no-any-return]

    def _read(self, stream: Any, sock: Any, limit: int) -> bytes | None:
        deadline = time.monotonic() + self.timeout
        chunks: list[bytes] = []
        size = 0
        try:
            while size < limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                chunk = stream.read(min(65536, limit - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError:  # socket.timeout included
            return None
        finally:
            sock.settimeout(None)
        return b"".join(chunks)


class _Server(BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Any, options: dict[str, Any], whole_bodies: bool) -> None:
        self._app = app
        self._options = options
        self._whole_bodies = whole_bodies
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return BoundedBody(self._app) if self._whole_bodies else self._app


def serve(
    app: Any,
    *,
    host: str,
    port: int,
    threads: int,
    started: Callable[[], None] | None = None,
    stopping: Callable[[], None] | None = None,
    whole_bodies: bool = True,
) -> None:
    """Serve ``app`` until SIGTERM. In the worker process, ``started`` is called once it is
    up and ``stopping`` once it takes no more requests (the drain); in-flight requests and
    ``stopping`` get ``GRACEFUL_TIMEOUT_SECONDS`` together. ``whole_bodies``: each request's
    body is read whole, under a deadline, before the app runs (``BoundedBody``); an app that
    streams large bodies (the artifacts service) bounds its own reads instead."""
    hooks: dict[str, Any] = {}
    if started is not None:
        hooks["post_worker_init"] = lambda _worker: started()
    if stopping is not None:
        hooks["worker_int"] = lambda _worker: _ignore_quits()  # the first quit signal's
        hooks["worker_exit"] = lambda _server, _worker: _drain(stopping)
    _Server(
        app,
        {
            **hooks,
            "bind": f"{host}:{port}",
            "workers": 1,
            # gthread, reading each request's head (and, for whole bodies, its body) in its
            # event loop before a thread takes it: a slow client never holds a thread.
            "worker_class": "functions.http.prefetching_worker."
            + ("WholeRequestsWorker" if whole_bodies else "PrefetchingWorker"),
            "threads": threads,
            "timeout": 0,  # requests legitimately last as long as a resource script
            "graceful_timeout": GRACEFUL_TIMEOUT_SECONDS,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "control_socket_disable": True,  # gunicorn 27 would write it under $HOME (read-only)
        },
        whole_bodies,
    ).run()


def _drain(stopping: Callable[[], None]) -> None:
    """Run ``stopping`` to its end; the master's kill at ``graceful_timeout`` bounds it."""
    _ignore_quits()
    stopping()


def _ignore_quits() -> None:
    """A Ctrl-C reaches the worker twice (from the terminal, then from the master): gunicorn's
    quick exit on the second would cut the drain short, or skip it. A handler that does
    nothing, not SIG_IGN: one that arrived meanwhile would be reported as lost."""
    for quit_signal in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(quit_signal, _ignored)


def _ignored(_signum: int, _frame: object) -> None:
    pass
