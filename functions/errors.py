"""Errors of the functions layer, and the one place that decides how each is answered.

    FunctionError             retryable = False
    ├── InvalidRequest        the event or its data is wrong: HTTP 400, nothing started
    │   └── RequestIdReused   the run's (source, id) was used by another request: 400
    ├── NotAuthenticated      SENDER_AUDIENCE is set and the request has no valid token: 401
    ├── SenderNotAllowed      the token's identity is not in ALLOWED_SENDERS: 403
    │   └── TeamNotAllowed    the sender may not name the request's team (SENDER_TEAMS): 403
    ├── InputNotAllowed       a put's input is an artifact of another team: 403
    ├── TooManyRuns           the team has MAX_RUNS_PER_TEAM runs in flight here: 429
    ├── Unavailable           retryable = True: infrastructure trouble (store, engine or
    │   │                     cluster unreachable): HTTP 503, so Knative redelivers
    │   └── SinkRefused       K_SINK did not take a reply event (requests' error is the cause)
    ├── ConfigError           the service's own configuration is wrong: refuse to start
    └── KubeApiError          a Kubernetes API answer the runtime handles itself
        ├── NotFound          404
        ├── Conflict          409
        ├── Gone              410: a watch's resourceVersion is too old
        └── Rejected          any other 4xx: the API refused the request as invalid

``storage.store_errors.StorageError`` carries ``retryable`` the same way. ``classify`` is THE
decision, for every path (the service, both runtimes, the in-pod steps): an error becomes a
``Classified`` (its failure kind, whether it is retryable, its message), and
``functions.steps.outcome.final_failure`` turns that into "503" (raise ``Unavailable``) or "200 +
failed event" (an ``Outcome``). HTTP answers are judged by ``storage.store_errors.retryable_status``
and image pulls by ``pull_is_transient``, the same on both runtimes. A resource that runs and
fails is *not* an error: it is an ``Outcome`` with a failure kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from functions.model import FAILURE_KINDS, FailureKind
from storage.store_errors import StorageError


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


class InputNotAllowed(FunctionError):
    """A put's input is not an artifact of the put's team (``service.teams.ArtifactTeams``)."""


class TooManyRuns(FunctionError):
    """The request's team has ``MAX_RUNS_PER_TEAM`` runs in flight on this replica: answered
    429 with ``Retry-After`` before anything starts (the Broker retries it)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(FunctionError):
    """A dependency is unreachable or failing; the same request may succeed later."""

    retryable = True


class RunStopped(Unavailable):
    """Its sender stopped the run as it was starting (``functions.service.stop_requests``): nothing
    was left to run. Retryable on purpose: a redelivery finds the run marked stopped and is
    answered with no reply, as every later delivery is."""


class QuotaExceeded(Unavailable):
    """The namespace's ResourceQuota has no room for the object now (Kubernetes answers 403
    "exceeded quota"): not a missing right; there may be room later."""


class SinkRefused(Unavailable):
    """The sink could not be reached or answered with an error, after retries; ``status``:
    its last answer's HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


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


@dataclass(frozen=True)
class Classified:
    """What a failure means for its request: the reply's kind if it is final, and whether
    the same request may succeed later (then it is answered 503 and redelivered)."""

    kind: FailureKind
    retryable: bool
    message: str


def classify(err: BaseException) -> Classified:
    """THE classification of an error (see the module's docstring)."""
    return Classified(failure_kind(err), is_retryable(err), str(err))


def is_retryable(err: BaseException) -> bool:
    """Whether trying the same request again later may succeed."""
    return bool(getattr(err, "retryable", False))


def failure_kind(err: BaseException) -> FailureKind:
    """The failure kind a permanent error becomes in a ``…failed`` reply."""
    declared = getattr(err, "failure_kind", None)
    if declared in FAILURE_KINDS:
        return declared  # type: ignore[no-any-return]
    return "storage" if isinstance(err, StorageError) else "runtime"


# What a registry's refusal of a pull says, in the engine's or the kubelet's words.
_PULL_FINAL = re.compile(
    r"not found|no such image|manifest unknown|name unknown|unauthori[sz]ed|denied|forbidden|"
    r"invalid reference|invalid image name|repository does not exist|no such host",
    re.IGNORECASE,
)
_PULL_TRANSIENT = re.compile(
    r"\b(5\d\d|429)\b|too many requests|service unavailable|bad gateway|gateway time-?out|"
    r"internal server error|timed? ?out|timeout|connection (refused|reset)|"
    r"temporar(y|ily)|try again|\bEOF\b",
    re.IGNORECASE,
)


def pull_is_transient(message: str, status: int = 0) -> bool:
    """Whether an image pull that failed with ``message`` (and, from an engine's API, its
    HTTP ``status``) may succeed later: a registry answering 5xx or 429, or not answering in
    time, is; an unknown image, one the registry refuses to this puller, or a name that
    cannot be a registry is not (the request fails at once, kind ``image_pull``). One rule
    for both runtimes: Podman's API answers and the kubelet's ``ErrImagePull`` messages."""
    if _PULL_FINAL.search(message):
        return False
    # Podman's API answers 500 for every failed pull: only its message tells.
    return status in (429, 502, 503, 504) or bool(_PULL_TRANSIENT.search(message))


def unavailable(err: BaseException, what: str = "") -> Unavailable:
    """``err`` as an ``Unavailable`` (itself, if it is one already); raise it ``from err``."""
    if isinstance(err, Unavailable):
        return err
    prefix = what or ("store" if isinstance(err, StorageError) else "runtime")
    return Unavailable(f"{prefix}: {err}")
