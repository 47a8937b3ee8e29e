"""A refusal answered as a reply too: a request that will never run (400 for its data, 403 for
an input of another team) and carries a ``subject`` gets, besides its HTTP status, a
``<action>.failed`` reply event posted to K_SINK (kind ``invalid_request``, the refusal's
message, its ``requestid``, ``subject`` and ``team``). Behind a Broker the HTTP status reaches
no one (the event is dead-lettered), while a sender that waits for replies (the Tekton
controller, by subject) would wait for its timeout: it learns at once instead.

The message names what was wrong (a field, a type, an input), never a value of ``source`` or
``params``. The event's id derives from the request's ``(source, id)``: a refusal delivered
again is the same reply. A sink that refuses it changes nothing: the status stands.
"""

from __future__ import annotations

import logging

from cloudevents.core.v1.event import CloudEvent

from functions import keys
from functions.errors import SinkRefused
from functions.logs import fields
from functions.model import Action, Failure, Outcome, ReplyAddress
from functions.replies import TEAM_ATTRIBUTE, reply_event
from functions.sink import post_reply

log = logging.getLogger("functions.http.refusals")


def refusal_reply(action: Action, event: CloudEvent, message: str) -> CloudEvent | None:
    """The failed reply answering refused ``event``, or None when it names no subject."""
    subject = event.get_subject()
    if not subject:
        return None
    team = event.get_extension(TEAM_ATTRIBUTE)
    outcome = Outcome(action, failure=Failure(kind="invalid_request", message=message))
    run = keys.request_label(event.get_source(), event.get_id())
    address = ReplyAddress(event.get_id(), run, subject, team if isinstance(team, str) else "")
    return reply_event(action, outcome, address)


def post_refusal(sink: str, action: Action, event: CloudEvent | None, message: str) -> None:
    """Post the refusal's reply to ``sink`` (none without a sink, an event or a subject)."""
    reply = refusal_reply(action, event, message) if sink and event is not None else None
    if reply is None:
        return
    try:
        post_reply(sink, reply, attempts=3, timeout=10)
    except SinkRefused as err:
        log.warning("refusal not replied", extra=fields(action=action, error=str(err)))
