"""The run id a service gives a request (``keys.run_id`` under the deployment's
``CACHE_SECRET``), for tests that look up what a run left (its result, log, container)."""

from __future__ import annotations

from functions.keys import ANONYMOUS, run_id


def run_of(
    secret: str | bytes,
    event_source: str,
    event_id: str,
    action: str,
    *,
    sender: str = ANONYMOUS,
    team: str = "",
) -> str:
    return run_id(
        secret.encode() if isinstance(secret, str) else secret,
        sender=sender,
        team=team,
        event_source=event_source,
        event_id=event_id,
        action=action,
    )
