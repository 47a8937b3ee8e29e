"""The Flask application of one service: ``create_app(settings, action)``.

Routes: ``POST /`` takes a request CloudEvent (binary or structured mode), or a stop of one
(``service.stop_requests``), and answers per the
event contract (200 + reply event, 202, 400 + JSON error, 503 + JSON error; 401/403 when
``SENDER_AUDIENCE`` is set and the sender is unknown or not allowed; a 400 or an input's 403
of a request with a subject is posted to K_SINK as a failed reply too: ``refusals``);
``GET /healthz``; ``GET /readyz`` (the store and the runtime answer); ``GET /metrics``
(Prometheus text format).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from functions import events
from functions.credentials import make_provider
from functions.errors import (
    InputNotAllowed,
    InvalidRequest,
    NotAuthenticated,
    SenderNotAllowed,
    TeamNotAllowed,
    TooManyRuns,
    Unavailable,
)
from functions.http.metered_store import MeteredStore
from functions.http.readiness import Readiness
from functions.http.refusals import post_refusal
from functions.http.repeated_gets import RepeatedGets
from functions.http.senders import SenderCheck, sender_check_from
from functions.keys import ANONYMOUS
from functions.logs import fields
from functions.metrics import Metrics
from functions.model import Action
from functions.runtimes import Runtime, make_runtime
from functions.runtimes.warm.pool import REASONS
from functions.service.config import ServiceConfig
from functions.service.service import Service
from functions.settings import Settings
from storage import Store, open_store

log = logging.getLogger("functions.http.app")


def create_app(
    settings: Settings,
    action: Action,
    *,
    store: Store | None = None,
    runtime: Runtime | None = None,
    senders: SenderCheck | None = None,
) -> Flask:
    senders = senders or sender_check_from(settings)
    metrics = Metrics()
    store = MeteredStore(store or open_local_or_remote_store(settings), metrics.store_seconds)
    runtime = runtime or make_runtime(settings, store)
    metrics.count_waiting(action, runtime.tasks_waiting)
    metrics.count_warm(runtime.warm_counts, REASONS)
    if settings.cache_secret_generated:
        log.warning(
            "CACHE_SECRET is not set: using a random key, so cache entries do not "
            "survive a restart and are not shared between replicas"
        )
    service = Service(
        action, ServiceConfig.of(settings), store, runtime, metrics, make_provider(settings)
    )
    app = Flask(f"resource-functions-{action}")
    app.config["MAX_CONTENT_LENGTH"] = events.MAX_BODY_BYTES  # refused before it is read
    app.extensions["service"] = service
    if action == "get":
        app.wsgi_app = RepeatedGets(app.wsgi_app, service, senders)  # type: ignore[method-assign]
    sink = settings.sink
    app.add_url_rule("/", "event", lambda: _handle(service, senders, sink), methods=["POST"])
    app.add_url_rule("/healthz", "healthz", lambda: {"status": "ok", "action": action})
    readiness = Readiness(store, runtime)
    app.add_url_rule("/readyz", "readyz", lambda: _ready(readiness, action))
    app.add_url_rule(
        "/metrics",
        "metrics",
        lambda: Response(service.metrics.exposition(), mimetype="text/plain; version=0.0.4"),
    )
    return app


def open_local_or_remote_store(settings: Settings) -> Store:
    """Open STORE_URL for the service's request threads (each may use the store at once); a
    local directory store is created on first use (a bucket must exist)."""
    if settings.store_url.startswith("file://"):
        Path(settings.store_url[len("file://") :]).mkdir(parents=True, exist_ok=True)
    return open_store(settings.store_url, replace(settings.store_options, threads=settings.threads))


def _ready(readiness: Readiness, action: Action) -> Response:
    status, body = readiness.probe()
    response = jsonify({**body, "action": action})
    response.status_code = status
    return response


def _handle(service: Service, senders: SenderCheck | None, sink: str) -> Response:
    status, response = _respond(service, senders, sink)
    service.metrics.requests.labels(service.action, str(status)).inc()
    return response


def _respond(service: Service, senders: SenderCheck | None, sink: str) -> tuple[int, Response]:
    event = None
    try:
        sender = ANONYMOUS
        if senders is not None:  # before the body is read
            sender = senders.sender(request.headers.get("Authorization"))
        event = events.read_event(dict(request.headers), request.get_data())
        reply = service.handle(event, sender)
    except InvalidRequest as err:
        log.info("invalid request", extra=fields(action=service.action, problems=err.problems))
        post_refusal(sink, service.action, event, f"refused (400): {err}")
        return 400, _error(400, "invalid_request", err, problems=err.problems)
    except NotAuthenticated as err:
        log.info("sender refused", extra=fields(action=service.action, error=str(err)))
        response = _error(401, "not_authenticated", err)
        response.headers["WWW-Authenticate"] = f'Bearer realm="{senders and senders.audience}"'
        return 401, response
    except SenderNotAllowed as err:
        log.info("sender refused", extra=fields(action=service.action, error=str(err)))
        kind = "team_not_allowed" if isinstance(err, TeamNotAllowed) else "sender_not_allowed"
        return 403, _error(403, kind, err)
    except InputNotAllowed as err:
        log.info("input refused", extra=fields(action=service.action, error=str(err)))
        post_refusal(sink, service.action, event, f"refused (403): {err}")
        return 403, _error(403, "input_not_allowed", err)
    except TooManyRuns as err:
        log.info("too many runs", extra=fields(action=service.action, error=str(err)))
        response = _error(429, "too_many_runs", err)
        response.headers["Retry-After"] = str(err.retry_after)
        return 429, response
    except Unavailable as err:
        log.warning("unavailable", extra=fields(action=service.action, error=str(err)))
        return 503, _error(503, "unavailable", err)
    except RequestEntityTooLarge:
        too_large = InvalidRequest(f"request body is larger than {events.MAX_BODY_BYTES} bytes")
        return 400, _error(400, "invalid_request", too_large, problems=too_large.problems)
    except Exception:  # a bug: keep the message generic (it may hold request data), retry
        log.exception("internal error", extra=fields(action=service.action))
        return 503, _error(503, "unavailable", Exception("internal error; see the service log"))
    if reply.event is None:
        return reply.status, Response(status=reply.status)
    headers, body = events.to_http(reply.event)
    return reply.status, Response(body, status=reply.status, headers=headers)


def _error(status: int, kind: str, err: Exception, **extra: Any) -> Response:
    response = jsonify({"error": {"kind": kind, "message": str(err), **extra}})
    response.status_code = status
    return response
