"""Plain data passed between the layers: requests, tasks and outcomes.

Nothing here does I/O. ``Task.stdin`` carries the resource's ``source`` and ``params``
(credentials), so a Task is never logged, serialised into a pod spec or stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Action = Literal["check", "get", "put"]
ACTIONS: tuple[Action, ...] = ("check", "get", "put")
# The kinds of a ``…failed`` reply (the event contract).
FailureKind = Literal[
    "invalid_request",
    "resource_failed",
    "invalid_output",
    "image_pull",
    "timeout",
    "storage",
    "runtime",
]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)

# The resource script each action runs, and its argv[1] (Concourse's paths).
SCRIPTS = {"check": "/opt/resource/check", "get": "/opt/resource/in", "put": "/opt/resource/out"}
WORKDIRS = {"check": None, "get": "/tmp/build/get", "put": "/tmp/build/put"}


@dataclass(frozen=True)
class Build:
    """The pipeline engine's description of the build a get/put belongs to."""

    id: str = ""
    name: str = ""
    job: str = ""
    pipeline: str = ""
    team: str = ""
    url: str = ""
    external_url: str = ""
    instance_vars: str = ""  # JSON text, as Concourse passes it


@dataclass(frozen=True)
class TraceContext:
    """The W3C trace context of a request (the CloudEvents distributed-tracing extension),
    validated, so it is safe in headers and env vars."""

    traceparent: str
    tracestate: str = ""


@dataclass(frozen=True)
class ResourceType:
    """How to run one resource type: its image and per-type pod settings."""

    image: str
    privileged: bool = False
    timeout_seconds: float | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    # Like Concourse's check_every: a check within this many seconds of the last one is
    # answered from the version history without a run (None or 0: every check runs).
    check_every: float | None = None
    build_size_limit: str = ""  # Kubernetes: the task's build emptyDir sizeLimit (a quantity)


@dataclass(frozen=True)
class Request:
    """A validated request event."""

    action: Action
    event_id: str
    event_source: str
    subject: str | None
    resource_type: ResourceType
    type_name: str | None  # catalogue name, if the request named one
    source: dict[str, Any] = field(repr=False)  # secret
    version: dict[str, str] | None
    params: dict[str, Any] = field(repr=False)  # secret
    inputs: dict[str, ArtifactRef]  # put only: input name -> artifact in the store
    build: Build
    reply_async: bool = False
    # check: "version": "latest-known", i.e. continue from the last version in the history
    latest_known: bool = False
    check_every: float | None = None  # check: this request's interval (overrides the type's)
    # Resolved credential values (``((var))`` references).
    secrets: tuple[str, ...] = field(default=(), repr=False)
    trace: TraceContext | None = None
    sender: str = "-"  # the authenticated sender (its token's identity), or "-" without one
    digest: str = ""  # keys.request_digest: what the request asks for, stored with its result


@dataclass(frozen=True)
class RepeatableGet:
    """A validated get, less what may change from one delivery to the next (its id, time and
    trace context): what a repeat of it needs to be answered from the cache memory. It holds
    no ``source`` or ``params``, only the keyed hash of them."""

    event_source: str
    subject: str | None
    type_name: str | None
    image: str
    cache_key: str
    sender: str = "-"
    team: str = ""


@dataclass(frozen=True)
class ArtifactRef:
    """An artifact in the store: its key and, when known, its digest."""

    key: str
    digest: str | None = None


@dataclass(frozen=True)
class ReplyAddress:
    """Whom a run's events answer, and as which run: the request's id (the events'
    ``requestid``), subject, team (their ``team`` attribute) and trace context, and the run
    the event ids derive from. One value from the request to the events, however they are
    sent (in the HTTP response, by the function, by ``collect`` in the task pod)."""

    request_id: str
    run_id: str
    subject: str | None = None
    team: str = ""
    trace: TraceContext | None = None


@dataclass(frozen=True)
class Task:
    """One run of a resource script, as a runtime sees it."""

    run_id: str
    action: Action
    resource_type: ResourceType
    stdin: bytes = field(repr=False)  # secret: source and params
    env: dict[str, str]
    inputs: dict[str, ArtifactRef]
    cache_key: str | None  # get: names the output artifact and its cache record
    timeout_seconds: float
    request_id: str = ""
    request_source: str = ""
    subject: str | None = None
    # Every value to redact from the run's output (``redaction.secret_values``): resolved
    # credential values, literal values under secret-named keys, URL userinfo.
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # The resolved credential values among them: a version holding one fails the run.
    resolved: tuple[str, ...] = field(default=(), repr=False)
    history: HistoryPlan | None = None  # check: where the versions found are recorded
    trace: TraceContext | None = None
    lease: LeaseHold | None = None  # an asynchronous check's: released once it has recorded
    request_digest: str = ""  # keys.request_digest of the request: its result records it
    team: str = (
        ""  # build.team: its events carry it; a warm check container is never shared across teams
    )

    @property
    def reply_address(self) -> ReplyAddress:
        return ReplyAddress(self.request_id, self.run_id, self.subject, self.team, self.trace)


@dataclass(frozen=True)
class LeaseHold:
    """The check lease an asynchronous check's task holds (``functions.ledger.lease``): the lease
    record's key and the nonce of this holding. Nobody renews it while the task runs; the
    task releases it once its outcome is recorded. No secret in it."""

    key: str  # leases/<resource-key>.json
    holder: str


@dataclass(frozen=True)
class HistoryPlan:
    """Where a check's findings go: the resource's key (``keys.resource_key``, an HMAC: no
    secret in it) and the bound on the versions kept (``HISTORY_LIMIT``)."""

    resource_key: str
    limit: int


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    message: str
    exit_code: int | None = None
    log_tail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind, "message": self.message}
        if self.exit_code is not None:
            body["exit_code"] = self.exit_code
        if self.log_tail:
            body["log_tail"] = self.log_tail
        return body


@dataclass(frozen=True)
class Phase:
    """A stretch of one run (image pull, stage, script, upload, store): wall-clock
    nanoseconds since the epoch, so it can also be exported as a trace span."""

    name: str
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class Outcome:
    """What a run produced: reply data on success, or a failure. ``phases`` says where the
    run that produced it spent its time; it is neither stored nor replied."""

    action: Action
    data: dict[str, Any] | None = None
    failure: Failure | None = None
    phases: tuple[Phase, ...] = field(default=(), compare=False)

    @property
    def succeeded(self) -> bool:
        return self.failure is None

    def as_record(self) -> dict[str, Any]:
        """The JSON stored under ``results/<run-id>.json`` (no secrets in it)."""
        if self.failure is not None:
            return {"action": self.action, "error": self.failure.as_dict()}
        return {"action": self.action, "data": self.data}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Outcome:
        if "error" in record:
            err = record["error"]
            failure = Failure(
                kind=err["kind"],
                message=err["message"],
                exit_code=err.get("exit_code"),
                log_tail=err.get("log_tail"),
            )
            return cls(action=record["action"], failure=failure)
        return cls(action=record["action"], data=record["data"])
