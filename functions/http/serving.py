"""Running a service under gunicorn (a production WSGI server).

One worker process with many threads: runs in flight and the single-flight registry live in
that process, and each request mostly waits on a container, a Job or the store.
"""
from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication


class _Server(BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Any, options: dict[str, Any]) -> None:
        self._app = app
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._app


def serve(app: Any, *, host: str, port: int, threads: int) -> None:
    """Serve ``app`` until SIGTERM; in-flight requests get ``graceful_timeout`` to finish."""
    _Server(app, {
        "bind": f"{host}:{port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": threads,
        "timeout": 0,  # requests legitimately last as long as a resource script
        "graceful_timeout": 30,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "control_socket_disable": True,  # gunicorn 27 would write it under $HOME (read-only)
    }).run()
