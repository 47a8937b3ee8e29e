"""The reply relay: where a task pod's ``collect`` step posts an asynchronous run's events.

Task pods run untrusted resource images, so the shipped NetworkPolicies let them reach
neither the functions nor the Broker: a resource image that could post into the Broker could
send requests naming any team, or forge other runs' replies. ``collect`` posts its run's
events here instead, with the run's reply token (``keys.reply_token``: the run's claims and a
keyed hash of them, which reaches the collect container alone, as a file of the run's
Secret). The relay forwards an event to its ``K_SINK`` (the Broker) only while the token has
not expired (the run's Job deadline) and only if the event is one the claims allow: the run's
reply (its reply id, the type of its action) or, for a check, a discovered version of its
resource; each with the run's request id, subject and team. A resource image holds no token,
so it can post nothing through here either.

Routes: ``POST /`` (202 forwarded; 401 no, a wrong or an expired token; 400 not an event; 403
not an event the token allows; 503 the sink is unreachable, so collect retries),
``GET /healthz``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import requests
from cloudevents.core.v1.event import CloudEvent
from flask import Flask, request

from functions import events, keys
from functions.errors import InvalidRequest, SinkRefused
from functions.logs import fields
from functions.replies import (
    DISCOVERED_TYPE,
    TEAM_ATTRIBUTE,
    discovered_id,
    reply_id,
    reply_type,
)
from functions.sink import RUN_HEADER, post_reply, session

log = logging.getLogger("functions.http.reply_relay")
# One session per request thread, kept: its connection to the Broker (and the name's lookup)
# serves the next events. Single attempt: collect retries a 503 with its own backoff.
_sessions = threading.local()


def _session() -> requests.Session:
    made = getattr(_sessions, "session", None)
    if made is None:
        made = _sessions.session = session(attempts=1)
    return made


def create_relay_app(secret: bytes, sink: str) -> Flask:
    """The relay, checking tokens under ``secret`` (``CACHE_SECRET``), forwarding to ``sink``."""
    app = Flask("resource-functions-reply-relay")
    app.add_url_rule("/", "event", lambda: _relay(secret, sink), methods=["POST"])
    app.add_url_rule("/healthz", "healthz", lambda: {"status": "ok", "action": "reply-relay"})
    return app


def _relay(secret: bytes, sink: str) -> tuple[dict[str, Any], int]:
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    claims = keys.reply_claims(secret, token) if scheme.lower() == "bearer" else None
    if claims is None or request.headers.get(RUN_HEADER, claims.run) != claims.run:
        return _refused(401, "not_authenticated", "no valid reply token for this run")
    if time.time() > claims.expires:
        return _refused(401, "not_authenticated", "the run's reply token has expired")
    run = claims.run
    try:
        event = events.read_event(dict(request.headers), request.get_data())
    except InvalidRequest as err:
        return _refused(400, "invalid_request", str(err))
    problem = _not_of_run(event, claims)
    if problem:
        log.warning("refused a relayed event", extra=fields(run_id=run, problem=problem))
        return _refused(403, "not_a_reply", problem)
    if not sink:
        return _refused(503, "unavailable", "the relay has no K_SINK to forward to")
    try:
        post_reply(sink, event, through=_session())
    except SinkRefused as err:
        return _refused(503, "unavailable", str(err))
    log.info("relayed", extra=fields(run_id=run, type=event.get_type(), id=event.get_id()))
    return {}, 202


def _not_of_run(event: CloudEvent, claims: keys.ReplyClaims) -> str | None:
    """Why ``event`` is not one that the run of ``claims`` may send, or None."""
    attributes = event.get_attributes()
    for name, claimed in (
        ("requestid", claims.request_id),
        ("subject", claims.subject),
        (TEAM_ATTRIBUTE, claims.team),
    ):
        if str(attributes.get(name) or "") != claimed:
            return f"its {name} is not this run's"
    kind = event.get_type()
    if kind == DISCOVERED_TYPE:
        return _not_discovered_by(event, claims)
    for succeeded in (True, False):
        if kind == reply_type(claims.action, succeeded):
            if event.get_id() == reply_id(claims.run, succeeded):
                return None
            return f"event {event.get_id()!r} is not this run's reply"
    return f"type {kind!r} is not this run's reply or a discovered version"


def _not_discovered_by(event: CloudEvent, claims: keys.ReplyClaims) -> str | None:
    """Why a ``version.discovered`` event is not one of the run's check, or None."""
    if claims.action != "check" or not claims.resource:
        return "only a check of a resource with a history discovers versions"
    data = event.get_data()
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("resource") != claims.resource:
        return "its resource is not this run's"
    if not isinstance(version, dict) or event.get_id() != discovered_id(claims.resource, version):
        return "its id is not its version's"
    return None


def _refused(status: int, kind: str, message: str) -> tuple[dict[str, Any], int]:
    return {"error": {"kind": kind, "message": message}}, status
