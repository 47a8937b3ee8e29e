"""The short way for repeated gets, in front of the Flask app of the get service.

Pipelines send the same get (same type, source, version, params) again and again, each time
as a new event. A binary-mode request whose event differs from one already validated only in
what changes between deliveries (``ce-id``, ``ce-time``, the trace context, Knative's arrival
time) is answered here from the cache memory: without Flask, the CloudEvents parser, the
validation or the cache key's hash, whose results it reuses (``Service.repeatable``). The
reply is the full way's: ``reply_event`` encoded by the SDK, made once per remembered record
and filled in per request with what differs (``ReplyForm``).

A first sighting is validated here by the full way's own functions (``events.read_event``,
``Service.repeatable``) and remembered. Anything else, and any doubt, goes the full way, which
answers as if this did not exist: an invalid request, a get the cache memory cannot answer
without a look in the store, one with ``((var))`` references, a value that would need
percent-decoding, a sender the check refuses, a body over 64 KiB. (A hit is answered in the
HTTP response in either reply mode, by both ways.)
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dateutil.parser import isoparse
from werkzeug.datastructures import EnvironHeaders

from functions import events
from functions.bounded_cache import BoundedCache
from functions.errors import InvalidRequest, NotAuthenticated, SenderNotAllowed, Unavailable
from functions.http.senders import SenderCheck
from functions.keys import ANONYMOUS
from functions.logs import fields
from functions.model import Outcome, RepeatableGet, ReplyAddress, TraceContext
from functions.replies import reply_event, reply_id
from functions.request_data import MAX_ATTRIBUTE
from functions.service.service import Service
from functions.tracing import trace_attributes, trace_context

log = logging.getLogger("functions.http.repeated_gets")
# The attributes a redelivery or a new request of the same get may change (WSGI names).
VARYING = ("HTTP_CE_ID", "HTTP_CE_TIME", "HTTP_CE_TRACEPARENT", "HTTP_CE_TRACESTATE")
# Set by a Knative Broker on each event; an extension nothing reads.
IGNORED = ("HTTP_CE_KNATIVEARRIVALTIME",)
# The CloudEvents HTTP binding's header characters that need no percent-encoding: printable
# ASCII but space, '"' and '%'.
_AS_IS = re.compile(r"[!#$&-~]+")
# The reply attributes that differ from one request to the next (``ReplyForm``).
PER_REQUEST = ("ce-id", "ce-requestid", "ce-time", "ce-traceparent", "ce-tracestate")
MAX_BODY = 64 * 1024  # a get's request is a few hundred bytes; larger ones go the full way
CAPACITY = 4096  # validated gets remembered (a few hundred bytes each)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class RepeatedGets:
    """WSGI middleware: answers a repeat of a validated get from the cache memory."""

    def __init__(
        self,
        app: WsgiApp,
        service: Service,
        senders: SenderCheck | None,
        capacity: int = CAPACITY,
    ) -> None:
        self.app = app
        self.service = service
        self.senders = senders
        # identity of a request (all but what varies) -> the get and its reply's HTTP form,
        # or None: not repeatable
        self._known: BoundedCache[bytes, Known | None] = BoundedCache(capacity)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        body = _small_body(environ)
        if body is None or "HTTP_CE_SPECVERSION" not in environ:
            return self.app(environ, start_response)
        try:
            reply = self._answer(environ, body)
        except (InvalidRequest, NotAuthenticated, SenderNotAllowed, Unavailable):
            reply = None  # the full way refuses it, and says why
        except Exception:  # a bug here: the full way still answers
            log.exception("the short way for repeated gets failed", extra=fields(action="get"))
            reply = None
        if reply is None:
            return self.app(environ, start_response)
        headers, payload = reply
        start_response("200 OK", [*headers.items(), ("Content-Length", str(len(payload)))])
        self.service.metrics.requests.labels(self.service.action, "200").inc()
        return [payload]

    def _answer(self, environ: dict[str, Any], body: bytes) -> tuple[dict[str, str], bytes] | None:
        delivery = _delivery(environ)
        if delivery is None:
            return None
        sender = ANONYMOUS
        if self.senders is not None:  # refused: the full way
            sender = self.senders.sender(environ.get("HTTP_AUTHORIZATION"))
        known = self._known_get(_identity(environ, body, sender), environ, body, sender)
        if known is None:
            return None
        event_id, trace = delivery
        hit = self.service.answer_repeat(known.get, event_id)
        if hit is None:
            return None
        run, outcome = hit
        form = known.form
        if form is None or form.record is not outcome.data:
            form = known.form = ReplyForm.of(known.get, run, outcome, event_id, trace)
        return form.fill(run, event_id, trace)

    def _known_get(
        self, identity: bytes, environ: dict[str, Any], body: bytes, sender: str
    ) -> Known | None:
        if identity in self._known:
            return self._known.get(identity)
        # A first sighting: validated as the full way does (an invalid one raises, and the
        # full way refuses it), then remembered.
        headers = dict(EnvironHeaders(environ))  # as the full way reads them (request.headers)
        get = self.service.repeatable(events.read_event(headers, body), sender)
        known = Known(get) if get is not None else None
        self._known.put(identity, known)
        return known


@dataclass
class Known:
    """A remembered get and, once one of its repeats was answered, its reply's HTTP form."""

    get: RepeatableGet
    form: ReplyForm | None = None


@dataclass(frozen=True)
class ReplyForm:
    """A hit's reply in binary mode, as ``reply_event`` and the SDK make it for one cache
    record, less the attributes that differ from one request to the next (its id, which
    derives from the run, ``requestid``, ``time`` and the trace context): filled in per
    request. Those values are taken only when the SDK would send them as they are
    (``_delivery``), and ``time`` is written as the SDK writes it."""

    record: Any  # the cache memory's record it was made from
    succeeded: bool
    headers: dict[str, str]
    body: bytes

    @staticmethod
    def of(
        get: RepeatableGet, run: str, outcome: Outcome, event_id: str, trace: TraceContext | None
    ) -> ReplyForm:
        event = reply_event(
            "get", outcome, ReplyAddress(event_id, run, get.subject, get.team, trace)
        )
        headers, body = events.to_http(event)
        fixed = {name: value for name, value in headers.items() if name not in PER_REQUEST}
        return ReplyForm(outcome.data, outcome.succeeded, fixed, body)

    def fill(
        self, run: str, event_id: str, trace: TraceContext | None
    ) -> tuple[dict[str, str], bytes]:
        headers = dict(self.headers)
        headers["ce-id"] = reply_id(run, self.succeeded)
        headers["ce-requestid"] = event_id
        headers["ce-time"] = _sdk_time(datetime.now(UTC))
        for name, value in trace_attributes(trace).items():
            headers[f"ce-{name}"] = value
        return headers, self.body


def _sdk_time(now: datetime) -> str:
    """A reply's ``time`` as the CloudEvents SDK sends it (ISO 8601, UTC as ``Z``)."""
    text = now.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _small_body(environ: dict[str, Any]) -> bytes | None:
    """A POST to / with a body of at most MAX_BODY, read (and put back for the app)."""
    if environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != "/":
        return None
    length = environ.get("CONTENT_LENGTH") or ""
    if not length.isdigit() or int(length) > MAX_BODY:
        return None
    body: bytes = environ["wsgi.input"].read(int(length))
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _identity(environ: dict[str, Any], body: bytes, sender: str) -> bytes:
    """A digest of everything that makes the request what it is: its sender, the body, its
    content type and every ``ce-`` header but those that vary between deliveries."""
    fixed = sorted(
        (name, value)
        for name, value in environ.items()
        if name.startswith("HTTP_CE_") and name not in VARYING and name not in IGNORED
    )
    head = repr((sender, environ.get("CONTENT_TYPE"), fixed)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(head + b"\0" + body).digest()


def _delivery(environ: dict[str, Any]) -> tuple[str, TraceContext | None] | None:
    """The event id and trace context, if the full way would take them as they are and the
    SDK would send them back so: None for a value outside the CloudEvents header set (which
    is percent-encoded both ways), an id the full way would refuse or a time it might."""
    if not all(_AS_IS.fullmatch(environ[name]) for name in VARYING if name in environ):
        return None
    event_id = environ.get("HTTP_CE_ID", "")
    if not event_id or len(event_id) > MAX_ATTRIBUTE:
        return None
    if "HTTP_CE_TIME" in environ and not _aware_time(environ["HTTP_CE_TIME"]):
        return None
    trace = trace_context(environ.get("HTTP_CE_TRACEPARENT"), environ.get("HTTP_CE_TRACESTATE"))
    return event_id, trace


def _aware_time(value: str) -> bool:
    """As the CloudEvents SDK takes ``time``: ISO 8601 with a time zone."""
    try:
        return isoparse(value).tzinfo is not None
    except (ValueError, OverflowError):
        return False
