"""Stop requests: how a sender stops a request it sent (the Tekton controller does, for a
cancelled or timed-out CustomRun). A stop is an event of the service's own request type (so
it takes the request's route, Triggers and EventPolicies) with the extension ``stops``
naming the id of the request to stop; its ``source`` and ``team`` attribute are the
request's, and its sender must be the request's: all four name the run (``keys.run_id``), so
nobody stops another sender's run. Its data is not read.

The service marks the run stopped (``functions.ledger.tombstones``) and tells the runtime to stop
whatever it runs for it (a Job, a container, a warm check under way); a request whose run is
marked is answered 200 with no reply event, however often it is delivered, and never
starts. A stop is answered 200 with no event; a stop of a run that ended changes nothing but
its redeliveries' answer (200 with no event)."""

from __future__ import annotations

from dataclasses import dataclass

from cloudevents.core.v1.event import CloudEvent

from functions import events
from functions.errors import InvalidRequest
from functions.events import STOP_ATTRIBUTE
from functions.model import Action
from functions.replies import TEAM_ATTRIBUTE
from functions.request_data import MAX_ATTRIBUTE
from functions.service.config import ServiceConfig
from functions.service.teams import check_team


@dataclass(frozen=True)
class Stop:
    """A validated stop request: the run of ``(sender, team, event_source, stops)``."""

    event_id: str
    event_source: str
    stops: str  # the id of the request to stop
    team: str
    sender: str


def is_stop(event: CloudEvent) -> bool:
    return event.get_extension(STOP_ATTRIBUTE) is not None


def parse_stop(event: CloudEvent, sender: str, *, action: Action, config: ServiceConfig) -> Stop:
    """The validated stop; ``InvalidRequest`` says what is wrong, ``TeamNotAllowed`` refuses
    a team its sender may not name (as for the request it stops)."""
    events.check_type(event, action)
    stops = event.get_extension(STOP_ATTRIBUTE)
    team = event.get_extension(TEAM_ATTRIBUTE)
    problems = []
    if not isinstance(stops, str) or not stops:
        problems.append(f"the {STOP_ATTRIBUTE!r} attribute must be the id of a request")
    elif len(stops) > MAX_ATTRIBUTE:
        problems.append(f"the {STOP_ATTRIBUTE!r} attribute is longer than {MAX_ATTRIBUTE}")
    elif stops == event.get_id():
        problems.append(f"a stop's own id cannot be the {STOP_ATTRIBUTE!r} it names")
    if team is not None and not isinstance(team, str):
        problems.append(f"the {TEAM_ATTRIBUTE!r} attribute must be a string")
    if len(event.get_source()) > MAX_ATTRIBUTE:
        problems.append(f"event attribute 'source' is longer than {MAX_ATTRIBUTE} characters")
    if problems:
        raise InvalidRequest(*problems)
    check_team(
        config.sender_teams,
        enforced=config.senders_known,
        sender=sender,
        team=team or "",
        attribute=team,
    )
    return Stop(
        event_id=event.get_id(),
        event_source=event.get_source(),
        stops=str(stops),
        team=team or "",
        sender=sender,
    )
