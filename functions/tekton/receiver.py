"""The HTTP endpoint for replies: a Knative Trigger (filtered to replies whose subject names a
CustomRun) delivers them here, and each is written into its CustomRun's status.

The answer is 202 with an empty body once the status is written (or the reply is stale),
never a CloudEvent, which the Broker would publish again; 503 when the status could not be
written, so that Knative delivers the reply again; 400 for what is not a reply event.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from functions.errors import InvalidRequest
from functions.events import MAX_BODY_BYTES, TYPE_PREFIX, read_event, reply_data_of
from functions.replies import TEAM_ATTRIBUTE
from functions.tekton.controller import Controller
from functions.tekton.decide import Reply, parse_subject

log = logging.getLogger("functions.tekton")


def reply_of(attributes: dict[str, Any], data: dict[str, Any]) -> tuple[str, str, Reply] | None:
    """``(namespace, name, reply)`` of a reply event's attributes, or None for an event that
    is no reply to a CustomRun (dropped)."""
    kind = str(attributes.get("type") or "")
    ended = kind.rpartition(".")[2]
    where = parse_subject(str(attributes.get("subject") or ""))
    request = attributes.get("requestid")
    if not kind.startswith(TYPE_PREFIX) or ended not in ("succeeded", "failed"):
        return None
    if where is None or not isinstance(request, str):
        return None
    action = kind[len(TYPE_PREFIX) :].rpartition(".")[0]
    reply = Reply(
        request,
        ended == "succeeded",
        data,
        action=action,
        source=str(attributes.get("source") or ""),
        team=str(attributes.get(TEAM_ATTRIBUTE) or ""),
    )
    return (*where, reply)


def serve(controller: Controller, host: str, port: int) -> ThreadingHTTPServer:
    """Start the receiver in a thread; ``shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the Deployment's probes
            self._answer(200 if self.path == "/healthz" else 404)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413)
                return
            body = self.rfile.read(length)
            try:
                event = read_event(dict(self.headers.items()), body)
            except InvalidRequest as err:
                self._answer(400, str(err))
                return
            found = reply_of(event.get_attributes(), reply_data_of(event))
            if found is None:
                self._answer(202)
                return
            try:
                controller.reply(*found)
            except Exception:
                log.exception("reply to customrun %s/%s not written", found[0], found[1])
                self._answer(503)
                return
            self._answer(202)

        def _answer(self, code: int, text: str = "") -> None:
            payload = text.encode()
            self.send_response(code)
            self.send_header("content-length", str(len(payload)))
            if payload:
                self.send_header("content-type", "text/plain; charset=utf-8")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="tekton-replies", daemon=True).start()
    return server


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    """``resource-functions tekton-controller``: the receiver, then the loop, until SIGTERM."""
    import signal

    from functions import logs
    from functions.runtimes.kube_api import api_client_from_env
    from functions.tekton.controller_config import ControllerConfig

    config = ControllerConfig.from_env()
    logs.configure("info")
    controller = Controller(api_client_from_env(), config)
    server = serve(controller, config.host, config.port)
    signal.signal(signal.SIGTERM, _interrupt)  # the watch may block for minutes: leave now
    log.info(
        "tekton-controller: replies on %s:%s, requests to %s",
        config.host,
        config.port,
        config.broker,
    )
    try:
        controller.run()
    except KeyboardInterrupt:
        pass
    finally:
        controller.stopped.set()
        server.shutdown()
    return 0
