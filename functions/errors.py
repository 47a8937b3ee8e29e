"""Errors of the functions layer, and the one place that decides how each is answered.

    FunctionError             retryable = False
    ├── InvalidRequest        the event or its data is wrong: HTTP 400, nothing started
    │   └── RequestIdReused   the run's (source, id) was used by another request: 400
    ├── NotAuthenticated      SENDER_AUDIENCE is set and the request has no valid token: 401
    ├── SenderNotAllowed      the token's identity is not in ALLOWED_SENDERS: 403
    │   └── TeamNotAllowed    the sender may not name the request's team (SENDER_TEAMS): 403
    ├── Unavailable           retryable = True: infrastructure trouble (store, engine or
    │   │                     cluster unreachable): HTTP 503, so Knative redelivers
    │   └── SinkRefused       K_SINK did not take a reply event (requests' error is the cause)
    ├── ConfigError           the service's own configuration is wrong: refuse to start
    └── KubeApiError          a Kubernetes API answer the runtime handles itself
        ├── NotFound          404
        ├── Conflict          409
        ├── Gone              410: a watch's resourceVersion is too old
        └── Rejected          any other 4xx: the API refused the request as invalid

``storage.errors.StorageError`` carries ``retryable`` the same way. ``is_retryable`` reads it
from any error; ``failure_kind`` names the failure a permanent one becomes;
``functions.outcome.final_failure`` is the one mapping to "503" (raise ``Unavailable``) or
"200 + failed event" (an ``Outcome``). A resource that runs and fails is *not* an error: it
is an ``Outcome`` with a failure kind.
"""

from __future__ import annotations

from storage.errors import StorageError


class FunctionError(Exception):
    """Base of the functions' own errors."""

    retryable = False


class InvalidRequest(FunctionError):
    """The request cannot be served as sent. ``problems`` lists each thing that is wrong."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class RequestIdReused(InvalidRequest):
    """Another request with the same sender, team and event ``(source, id)`` exists (stored,
    running, or adopted after a crash): this one is refused, never given its reply."""

    def __init__(self) -> None:
        super().__init__(
            "event id reused for another request: this (source, id) already names a request "
            "with other data from this sender and team; give each request its own id"
        )


class NotAuthenticated(FunctionError):
    """The request carries no bearer token valid for this service's audience."""


class SenderNotAllowed(FunctionError):
    """The request's token is valid, for an identity this service does not accept."""


class TeamNotAllowed(SenderNotAllowed):
    """The sender is allowed, but not for the team its request names."""


class Unavailable(FunctionError):
    """A dependency is unreachable or failing; the same request may succeed later."""

    retryable = True


class SinkRefused(Unavailable):
    """The sink could not be reached or answered with an error, after retries."""


class ConfigError(FunctionError, ValueError):
    """A setting is missing or malformed; the message names the variable."""


class KubeApiError(FunctionError):
    """A Kubernetes API error answer that is not ``Unavailable``."""


class NotFound(KubeApiError):
    pass


class Conflict(KubeApiError):
    pass


class Gone(KubeApiError):
    """A watch's resourceVersion is too old: list again."""


class Rejected(KubeApiError):
    """The API refused a request as invalid (4xx other than 401/403/404/409/410/429)."""


def is_retryable(err: BaseException) -> bool:
    """Whether trying the same request again later may succeed."""
    return bool(getattr(err, "retryable", False))


def failure_kind(err: BaseException) -> str:
    """The failure kind a permanent error becomes in a ``…failed`` reply."""
    declared = getattr(err, "failure_kind", None)
    if isinstance(declared, str):
        return declared
    return "storage" if isinstance(err, StorageError) else "runtime"


def unavailable(err: BaseException, what: str = "") -> Unavailable:
    """``err`` as an ``Unavailable`` (itself, if it is one already); raise it ``from err``."""
    if isinstance(err, Unavailable):
        return err
    prefix = what or ("store" if isinstance(err, StorageError) else "runtime")
    return Unavailable(f"{prefix}: {err}")
