"""A request event made a ``Request``: validated, its team checked against its sender, and
its ``((var))`` references resolved, all before anything is looked up or run."""

from __future__ import annotations

from dataclasses import replace

from cloudevents.core.v1.event import CloudEvent

from functions import credentials, events, keys
from functions.errors import InvalidRequest
from functions.model import Action, Request
from functions.replies import TEAM_ATTRIBUTE
from functions.request_data import image_allowed, image_refusal, parse_request_data
from functions.service.config import ServiceConfig
from functions.service.teams import check_team
from functions.tracing import trace_context


def parse(
    event: CloudEvent, sender: str, *, action: Action, config: ServiceConfig, artifacts: str
) -> Request:
    """The validated request of ``sender`` (its authenticated identity); ``artifacts`` is
    the URL prefix a put's inputs must start with. Raises ``InvalidRequest``, or
    ``TeamNotAllowed`` for a team its sender may not name (``teams.check_team``)."""
    events.check_type(event, action)
    reply_async = events.reply_async(event, default=config.reply_mode, sink=config.sink)
    data = events.event_data(event)
    request = parse_request_data(
        data,
        action=action,
        event=event.get_attributes(),
        resource_types=config.resource_types,
        artifact_url_prefix=artifacts,
        reply_async=reply_async,
    )
    check_team(
        config.sender_teams,
        enforced=config.senders_known,
        sender=sender,
        team=request.build.team,
        attribute=event.get_extension(TEAM_ATTRIBUTE),
    )
    trace = trace_context(event.get_extension("traceparent"), event.get_extension("tracestate"))
    digest = keys.request_digest(
        config.cache_secret, action=action, subject=request.subject, data=data
    )
    request = replace(request, trace=trace, sender=sender, digest=digest)
    image = request.resource_type.image
    if request.type_name is None and not image_allowed(image, config.allowed_images):
        raise InvalidRequest(image_refusal(image))
    return request


def resolve(provider: credentials.Provider, request: Request) -> Request:
    """The request with its ((var)) references resolved (after validation, before the
    cache key and the run). ``InvalidRequest`` names a variable that cannot be resolved;
    an unreachable provider raises ``Unavailable``."""
    resolved = credentials.resolve(
        provider,
        request.build,
        source=request.source,
        params=request.params,
        version=request.version,
    )
    if not resolved.values:
        return request
    return replace(
        request,
        source=resolved.source,
        params=resolved.params,
        version=resolved.version,
        secrets=resolved.values,
    )
