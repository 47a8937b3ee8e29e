"""The HTTP endpoint for replies: a Knative Trigger (filtered to replies whose subject names a
CustomRun) delivers them here, and each is written into its CustomRun's status.

The answer is 202 with an empty body once the status is written (or the reply is stale),
never a CloudEvent, which the Broker would publish again; 503 when the status could not be
written, so that Knative delivers the reply again; 400 for what is not a reply event. A reply
says how a run ended, so it is taken only with a token of the reply Trigger's identity
(``senders``: reviewed by the API server): 401 without a valid one, 403 for another
identity, both before the body is read.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from functions.errors import InvalidRequest, NotAuthenticated, SenderNotAllowed, Unavailable
from functions.events import MAX_BODY_BYTES, TYPE_PREFIX, read_event, reply_data_of
from functions.http.senders import SenderCheck
from functions.replies import TEAM_ATTRIBUTE
from functions.resources.decisions import parse_subject as parse_resource_subject
from functions.resources.scheduler import Scheduler
from functions.tekton.controller import Controller
from functions.tekton.decide import Reply, parse_subject

log = logging.getLogger("functions.tekton")


def reply_of(
    attributes: dict[str, Any], data: dict[str, Any]
) -> tuple[str, str, str, Reply] | None:
    """``(kind, namespace, name, reply)`` of a reply event's attributes (kind: ``CustomRun``
    or ``Resource``, by the subject), or None for an event that is no reply to either
    (dropped)."""
    kind = str(attributes.get("type") or "")
    ended = kind.rpartition(".")[2]
    subject = str(attributes.get("subject") or "")
    owner, where = "CustomRun", parse_subject(subject)
    if where is None:
        owner, where = "Resource", parse_resource_subject(subject)
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
    return (owner, *where, reply)


def serve(
    controller: Controller,
    host: str,
    port: int,
    senders: SenderCheck,
    scheduler: Scheduler | None = None,
) -> ThreadingHTTPServer:
    """Start the receiver in a thread; ``shutdown()`` stops it. Replies to Resources' checks
    go to ``scheduler`` (dropped without one)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the Deployment's probes, and Prometheus
            if self.path == "/metrics":
                self._answer(200, controller.metrics.exposition().decode())
                return
            self._answer(200 if self.path == "/healthz" else 404)

        def do_POST(self) -> None:
            try:
                senders.sender(self.headers.get("authorization"))
            except NotAuthenticated as err:
                self._answer(401, str(err))
                return
            except SenderNotAllowed as err:
                self._answer(403, str(err))
                return
            except Unavailable as err:
                self._answer(503, str(err))
                return
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
            owner, namespace, name, reply = found
            take = controller.reply if owner == "CustomRun" else scheduler and scheduler.reply
            if not take:
                self._answer(202)
                return
            try:
                take(namespace, name, reply)
            except Exception:
                log.exception("reply to %s %s/%s not written", owner.lower(), namespace, name)
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
    """``resource-functions tekton-controller``: the receiver, then the loop, until SIGTERM
    (or, electing a leader, until this replica loses the Lease: exit 1, to start again as a
    follower)."""
    import signal

    from functions import logs
    from functions.kube.api import KubeApi, api_client_from_env
    from functions.kube.custom_objects import CustomObjects
    from functions.kube.tekton_api import TektonApi
    from functions.resources.decisions import RESOURCES
    from functions.resources.decisions import Context as ResourceContext
    from functions.tekton.controller_config import ControllerConfig
    from functions.tekton.controller_metrics import ControllerMetrics
    from functions.tekton.leader import LeaderElection
    from functions.tekton.namespace_teams import NamespaceTeams

    config = ControllerConfig.from_env()
    logs.configure("info")
    api_client = api_client_from_env()
    metrics = ControllerMetrics()
    api = TektonApi(api_client, counted=metrics.api_requests.inc)
    teams = NamespaceTeams(config.teams, KubeApi(api_client, "", (5.0, 30.0)).namespace_labels)
    controller = Controller(api, config, teams, metrics=metrics)
    scheduler = Scheduler(
        CustomObjects(api_client, RESOURCES, counted=metrics.api_requests.inc),
        ResourceContext(
            event_source=config.event_source,
            team_of=teams.team_of,
            resource_types=config.resource_types,
            refusal=teams.refusal,
            allowed_images=config.allowed_images,
        ),
        config.broker,
        rate=config.resource_checks_per_second or None,
        metrics=metrics,
    )
    reviews = KubeApi(api_client, "", (5.0, 10.0)).review_token
    senders = SenderCheck(reviews, config.reply_audience, config.reply_senders)
    server = serve(controller, config.host, config.port, senders, scheduler)
    leader = (
        LeaderElection(api, config.namespace, config.leader_lease, config.identity)
        if config.leader_lease
        else None
    )
    signal.signal(signal.SIGTERM, _interrupt)  # the watch may block for minutes: leave now
    log.info(
        "tekton-controller %s: replies on %s:%s, requests to %s",
        config.identity,
        config.host,
        config.port,
        config.broker,
    )
    try:
        controller.run(leader, alongside=scheduler.run)
    except KeyboardInterrupt:
        pass
    finally:
        controller.stopped.set()
        server.shutdown()
    return 1 if controller.lost_lead else 0
