"""A call's answer as events: its reply, and first a check's ``version.discovered`` events."""

from __future__ import annotations

from cloudevents.core.v1.event import CloudEvent

from functions.errors import SinkRefused, Unavailable
from functions.model import Action, Outcome
from functions.replies import discovered_events, reply_event
from functions.service.call import Call
from functions.sink import post_events


def reply_of(action: Action, call: Call, outcome: Outcome) -> CloudEvent:
    return reply_event(action, outcome, call.reply_address)


def post_discoveries(sink: str, call: Call, outcome: Outcome) -> None:
    """A check's ``version.discovered`` events go to K_SINK (the HTTP response holds the
    reply alone). Without K_SINK they are not sent: the reply's ``new`` lists the same
    versions. A sink that refuses them is a 503: the redelivery replays the stored result
    and posts the same events (their ids derive from the resource and the version) again."""
    found = discovered_events(outcome, call.reply_address, call.plan)
    if not found or not sink:
        return
    try:
        post_events(sink, found)
    except SinkRefused as err:
        raise Unavailable(f"cannot post the version.discovered events: {err}") from err
