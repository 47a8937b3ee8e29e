"""The controller's configuration: the functions' ``Settings`` (it reads their ConfigMap, and
parses it as they do) plus its own environment.

``K_SINK``: the Broker's address (a SinkBinding sets it). ``STORE_URL`` and ``RESOURCE_TYPES``:
the functions' own, shared so that params are judged as the services judge them.
``TEKTON_TEAMS``: the namespace →
team mapping, shared with the artifacts service (unset: the namespaces an administrator
labelled, ``functions.tekton.namespace_teams``). ``ALLOWED_IMAGES``: the functions' own, so
that a request they would refuse is never posted. Its own: ``TEKTON_LEADER_LEASE`` (the Lease
its replicas elect a leader on, in ``POD_NAMESPACE``; empty: no election, one replica) and
``POD_NAME`` (this replica's identity). Sender authentication is required (the
``sender-auth`` component: ``SENDER_AUDIENCE``): without it any pod could post requests naming
any team into the Broker, so the controller refuses to start. Replies reach it only with a
token for ``TEKTON_REPLY_AUDIENCE`` (its reply Trigger's ``subscriber.audience``) of an
identity of ``TEKTON_REPLY_SENDERS`` (globs; by default that Trigger's OIDC identity).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from functions import keys
from functions.errors import ConfigError
from functions.model import ResourceType
from functions.setting_values import patterns
from functions.settings import Settings, own_namespace

EVENT_SOURCE = "/resource-functions/tekton-controller"
REPLY_AUDIENCE = "resource-functions-tekton-controller"  # knative/tekton/trigger.yaml
REPLY_TRIGGER = "tekton-replies"  # Knative names its identity <trigger>-oidc-eventing...


@dataclass(frozen=True)
class ControllerConfig:
    broker: str
    store_url: str
    resource_types: dict[str, ResourceType] = field(default_factory=dict)
    teams: dict[str, str] | None = None  # None: the namespaces labelled as teams
    event_source: str = EVENT_SOURCE
    host: str = "127.0.0.1"
    port: int = 8080
    resync_seconds: float = 300.0  # a fresh LIST this often, whatever the watch said
    allowed_images: tuple[str, ...] = ("*",)
    leader_lease: str = ""  # the Lease's name; "": no election
    namespace: str = ""  # where the Lease is: the controller's own
    identity: str = ""  # this replica's, in the Lease
    reply_audience: str = REPLY_AUDIENCE
    reply_senders: tuple[str, ...] = ()  # who may deliver replies (token usernames, globs)
    # Resources (docs/resources.md): checks posted a second at most; 0: the resources' mean
    # rate (Σ 1/interval), as Concourse's limiter does
    resource_checks_per_second: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControllerConfig:
        env = os.environ if environ is None else environ
        missing = [n for n in ("K_SINK", "STORE_URL") if not env.get(n)]
        if missing:
            raise ConfigError(f"tekton-controller needs {', '.join(missing)}")
        settings = Settings.from_env(env)
        if not settings.sender_audience:
            raise ConfigError(
                "tekton-controller needs sender authentication (SENDER_AUDIENCE is empty): "
                "add the sender-auth component with the tekton one (knative/sender-auth/), "
                "or any pod could post requests naming any team"
            )
        return cls.of(settings, env)

    @classmethod
    def of(cls, settings: Settings, env: Mapping[str, str]) -> ControllerConfig:
        """The functions' settings (read from the same ConfigMap, so parsed and judged as
        they parse them) and the controller's own environment."""
        namespace = env.get("POD_NAMESPACE") or own_namespace()
        return cls(
            broker=settings.sink,
            store_url=settings.store_url,
            resource_types=settings.resource_types,
            teams=settings.tekton_teams,
            host=settings.host,
            port=settings.port,
            allowed_images=settings.allowed_images,
            leader_lease=env.get("TEKTON_LEADER_LEASE", "").strip(),
            namespace=namespace,
            identity=env.get("POD_NAME") or socket.gethostname(),
            reply_audience=env.get("TEKTON_REPLY_AUDIENCE", "").strip() or REPLY_AUDIENCE,
            reply_senders=patterns(env.get("TEKTON_REPLY_SENDERS"))
            if env.get("TEKTON_REPLY_SENDERS", "").strip()
            else (trigger_identity(namespace, REPLY_TRIGGER),),
            resource_checks_per_second=rate(env.get("RESOURCE_CHECKS_PER_SECOND", "")),
        )

    @property
    def artifact_url_prefix(self) -> str:
        return keys.artifacts_url_prefix(self.store_url)


def rate(text: str) -> float:
    """RESOURCE_CHECKS_PER_SECOND: a number ≥ 0 (empty: 0, the resources' mean rate)."""
    try:
        value = float(text.strip() or "0")
    except ValueError:
        value = -1.0
    if not value >= 0.0 or value == float("inf"):
        raise ConfigError(f"RESOURCE_CHECKS_PER_SECOND must be a number >= 0, not {text!r}")
    return value


def trigger_identity(namespace: str, trigger: str) -> str:
    """The username of the OIDC identity Knative Eventing delivers a Trigger's events with."""
    return f"system:serviceaccount:{namespace}:{trigger}-oidc-eventing.knative.dev-trigger"
