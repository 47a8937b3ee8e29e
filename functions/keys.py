"""Names derived from requests: run ids, cache keys and store keys (pure functions).

Cache keys are HMAC-SHA256 under the configured CACHE_SECRET, so a key in the store reveals
nothing about the credentials in ``source`` or ``params`` and cannot be guessed from them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    # ASCII escapes: any str (even a lone surrogate from hostile JSON) has an encoding.
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def run_id(event_source: str, event_id: str, action: str = "") -> str:
    """Identity of one request: the CloudEvent (source, id) pair, as 32 hex chars. The action
    keeps a client that reuses an id across the three services from getting another
    service's stored answer."""
    parts = [event_source, event_id, action] if action else [event_source, event_id]
    return hashlib.sha256(canonical_json(parts)).hexdigest()[:32]


def cache_key(
    secret: bytes, *, image: str, source: Any, version: Any, params: Any, action: str = "get"
) -> str:
    """Keyed hash of what determines a resource's output: the same inputs as Concourse's
    resource cache (image, source, version, params), plus the action."""
    message = canonical_json(
        {"action": action, "image": image, "source": source, "version": version, "params": params}
    )
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def resource_key(secret: bytes, *, image: str, source: Any) -> str:
    """Keyed hash naming a resource (image + source, as Concourse's resource config): the key
    of its version history."""
    return cache_key(secret, image=image, source=source, version=None, params={}, action="history")


def history_record_key(key: str) -> str:
    """The record holding a resource's version history (``functions.history``)."""
    return f"history/{key}.json"


def lease_record_key(key: str) -> str:
    """The record naming the run that checks a resource now (``functions.lease``)."""
    return f"leases/{key}.json"


def artifact_key(key: str, suffix: str) -> str:
    return f"artifacts/{key}{suffix}"


def cache_record_key(key: str) -> str:
    """The small JSON next to an artifact that makes it a cache entry (version, metadata,
    artifact url/digest/size/format); written after the artifact, so its presence means
    the artifact is complete."""
    return f"artifacts/{key}.json"


def result_key(run: str) -> str:
    return f"results/{run}.json"


def log_key(run: str) -> str:
    return f"logs/{run}.log"
