"""Names derived from requests: run ids, cache keys and store keys (pure functions).

Cache keys are HMAC-SHA256 under the configured CACHE_SECRET, so a key in the store reveals
nothing about the credentials in ``source`` or ``params`` and cannot be guessed from them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any


def canonical_json(value: Any) -> bytes:
    # ASCII escapes: any str (even a lone surrogate from hostile JSON) has an encoding.
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


ANONYMOUS = "-"  # the sender of a request when no sender authentication is configured


def run_id(
    secret: bytes, *, sender: str, team: str, event_source: str, event_id: str, action: str
) -> str:
    """Identity of one request, as 32 hex chars: a keyed hash (``CACHE_SECRET``) of who sent
    it (the authenticated sender, or ``ANONYMOUS``), the team it names, and its CloudEvent
    ``(source, id)`` pair for this action. So a pair reused by another sender, for another
    team or another service never names this request's run, and the id reveals nothing."""
    message = canonical_json([sender, team, event_source, event_id, action])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def request_label(event_source: str, event_id: str) -> str:
    """A label value naming one request's ``(source, id)`` pair (40 hex chars, unkeyed: the
    pair is no secret): on the task Job, so an operator finds the run a sender asked for.
    (A sender stops it with a stop request: ``functions.service.stop_requests``.)"""
    return hashlib.sha256(canonical_json([event_source, event_id])).hexdigest()[:40]


def request_digest(secret: bytes, *, action: str, subject: str | None, data: Any) -> str:
    """A keyed hash of what a request asks for (its action, subject and ``data`` as sent,
    ``((var))`` references unresolved): stored with its result, so a later request reusing the
    run's ``(source, id)`` for something else is told so instead of getting this reply."""
    message = canonical_json({"action": action, "subject": subject, "data": data})
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def cache_key(
    secret: bytes, *, image: str, source: Any, version: Any, params: Any, action: str = "get"
) -> str:
    """Keyed hash of what determines a resource's output: the same inputs as Concourse's
    resource cache (image, source, version, params), plus the action."""
    message = canonical_json(
        {"action": action, "image": image, "source": source, "version": version, "params": params}
    )
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def resource_key(secret: bytes, *, image: str, source: Any, team: str) -> str:
    """Keyed hash naming a resource (image + source, as Concourse's resource config) of one
    team (``build.team``; ``""``: requests naming none): the key of its version history, its
    check lease and its ``version.discovered`` ids. Teams' checks of one source are apart, as
    Concourse scopes a resource to its pipeline. A team-less resource keeps its key from
    before teams entered it, so its history carries over."""
    if not team:
        return cache_key(
            secret, image=image, source=source, version=None, params={}, action="history"
        )
    message = canonical_json({"action": "history", "image": image, "source": source, "team": team})
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def history_record_key(key: str) -> str:
    """The record holding a resource's version history (``functions.ledger.history``)."""
    return f"history/{key}.json"


def lease_record_key(key: str) -> str:
    """The record naming the run that checks a resource now (``functions.ledger.lease``)."""
    return f"leases/{key}.json"


ARTIFACTS = "artifacts/"  # every artifact, cache record and team record is under it
INPUTS = ARTIFACTS + "inputs/"  # directories handed over from outside a get (pack, run)


def input_key(suffix: str, now: datetime) -> str:
    """A new input's key: under the day it was handed over (UTC; what expires it,
    ``functions.ledger.inputs``), a random name, the format's suffix."""
    return f"{INPUTS}{now.astimezone(UTC):%Y-%m-%d}/{uuid.uuid4().hex}{suffix}"


def artifacts_url_prefix(store_url_prefix: str) -> str:
    """The URL prefix of a store's artifacts, from the store's own (``url_prefix``)."""
    return store_url_prefix.rstrip("/") + "/" + ARTIFACTS


def artifact_key(key: str, suffix: str) -> str:
    return f"{ARTIFACTS}{key}{suffix}"


def cache_record_key(key: str) -> str:
    """The small JSON next to an artifact that makes it a cache entry (version, metadata,
    artifact url/digest/size/format); written after the artifact, so its presence means
    the artifact is complete."""
    return f"{ARTIFACTS}{key}.json"


def result_key(run: str) -> str:
    return f"results/{run}.json"


def log_key(run: str) -> str:
    return f"logs/{run}.log"


def stop_key(run: str) -> str:
    """A stopped run's tombstone (``functions.ledger.tombstones``): beside its result, so the same
    expiry rule removes both."""
    return f"results/{run}.stopped.json"


@dataclass(frozen=True)
class ReplyClaims:
    """What a run's reply token lets its holder post through the reply relay: events of run
    ``run`` (an ``action``) answering request ``request_id`` with ``subject`` and ``team``,
    a check's discovered versions of ``resource`` (its history key), until ``expires`` (unix
    seconds: the run's Job deadline)."""

    run: str
    action: str
    request_id: str
    subject: str = ""
    team: str = ""
    resource: str = ""
    expires: int = 0


def reply_token(secret: bytes, claims: ReplyClaims) -> str:
    """The token a run's ``collect`` step shows the reply relay (``functions.http.reply_relay``):
    its claims, readable, and a keyed hash of them, so only whoever was given it (the collect
    container, through the run's Secret) can post, and only what the claims say."""
    body = base64.urlsafe_b64encode(canonical_json(asdict(claims))).rstrip(b"=").decode()
    return f"{body}.{_token_mac(secret, body)}"


def reply_claims(secret: bytes, token: str) -> ReplyClaims | None:
    """The claims of a reply token made under ``secret``; None for any other string (one
    with text beyond ASCII included: ``compare_digest`` refuses such text)."""
    if not token.isascii():
        return None
    body, _, mac = token.rpartition(".")
    if not body or not hmac.compare_digest(mac, _token_mac(secret, body)):
        return None
    try:
        fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        return ReplyClaims(**fields)
    except (ValueError, TypeError):
        return None


def _token_mac(secret: bytes, body: str) -> str:
    return hmac.new(secret, f"reply-token:{body}".encode(), hashlib.sha256).hexdigest()
