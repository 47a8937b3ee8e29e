"""The production path as a multi-team cluster runs it, for the modules that need it: Knative
Eventing's ``authentication-oidc`` on, ``knative/`` applied with the ``sender-auth`` and
``tekton`` components, NetworkPolicies enforced, Tekton installed, and the pipeline teams'
namespaces labelled by an administrator (``resource-functions.dev/team``).

Knative gives a Broker, its Triggers and their Subscriptions their OIDC identities when it
reconciles them with the feature on, and does not go back to objects made before: the
feature is turned on first, what earlier modules left in the namespace deleted, and only then
is the deployment applied. The feature stays on for the rest of the session, so the modules
that use this run last (``tests/cluster/conftest.py`` orders them).

    secure(cluster, knative, images, s3, sink, tmp) -> Secured   (the session fixture ``secured``)
    Secured.token(account, namespace)    a token of that ServiceAccount for the Broker
    Secured.post(event, account, namespace)   POST to the Broker from this machine with it
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import requests
import yaml
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.cli.launch import wait_until
from testbed.kubernetes import Cluster
from tests.cluster.conftest import (
    NAMESPACE,
    KnativeDeployment,
    deployment_overlay,
    knative_diagnostics,
    sink_trigger,
    wait_functions_serve,
    wait_ready,
)

FEATURE = "authentication-oidc"
TEAM_LABEL = "resource-functions.dev/team"
# The pipeline teams' namespaces (each its own team), named in the controller's policy: the
# Tekton modules' and the controller's load figure's (test_tekton_custom_task.py).
LOAD_TEAMS = tuple(f"tekton-load-{n}" for n in range(10))
PIPELINE_TEAMS = ("tekton-ct", "tekton-git", *LOAD_TEAMS)
SENDERS_NAMESPACE = "ci"
ENGINE = "pipeline-engine-main"  # knative/sender-auth/broker-team-policy.yaml names it
TRIGGERS = ("check-requested", "get-requested", "put-requested")
FILTER_AUDIENCE = "mt-broker-filter"  # Knative's broker filter (pkg/broker/filter)
FUNCTIONS_AUDIENCE = "resource-functions"  # knative/sender-auth/triggers-patch.yaml
POLICIES = ("broker-team-main", "broker-replies", "broker-tekton-controller")
PROBE_TYPE = "dev.resourcefunctions.test.probe"  # no function's Trigger takes it
EVENTING_KINDS = "ksvc,trigger,broker,sinkbinding,pingsource,eventpolicy,subscription"
DELETE_ALL = ("--all", "--ignore-not-found", "--wait", "--timeout=300s")
READY = (
    *(f"ksvc/{name}" for name in ("check", "get", "put", "dead-letter")),
    "broker/default",
    "trigger --all",
    "eventpolicy --all",
    "sinkbinding --all",
)


def identity(name: str, kind: str = "trigger") -> str:
    """The OIDC identity Knative gives a Trigger or a SinkBinding of the namespace
    (pkg/auth, GetOIDCServiceAccountNameForResource)."""
    group = "eventing.knative.dev" if kind == "trigger" else "sources.knative.dev"
    return f"system:serviceaccount:{NAMESPACE}:{name}-oidc-{group}-{kind}"


@dataclass
class Secured:
    deployment: KnativeDeployment
    audience: str  # the Broker's
    probes: list[int]  # statuses until the path took the feature up

    @property
    def cluster(self) -> Cluster:
        return self.deployment.cluster

    @property
    def broker(self) -> str:
        return self.deployment.broker

    def token(self, account: str, namespace: str = NAMESPACE) -> str:
        """A token of ServiceAccount ``namespace/account`` for the Broker's audience (as an
        administrator mints one: the test stands in for that account's pods)."""
        return self.cluster.kubectl(
            "-n", namespace, "create", "token", account, "--audience", self.audience
        ).strip()

    def post(
        self, event: CloudEvent, account: str = ENGINE, namespace: str = SENDERS_NAMESPACE
    ) -> int:
        """POST ``event`` to the Broker from this machine with that account's token."""
        message = to_binary_event(event)
        headers = {**message.headers, "Authorization": f"Bearer {self.token(account, namespace)}"}
        return requests.post(
            self.broker, headers=headers, data=message.body, timeout=30
        ).status_code


# --- the feature -------------------------------------------------------------------------


def set_feature(cluster: Cluster, value: str | None) -> None:
    """The feature's value in config-features (None: no value, as a merge patch removes it)."""
    patch = json.dumps({"data": {FEATURE: value}})
    features = ("-n", "knative-eventing", "patch", "configmap", "config-features")
    cluster.kubectl(*features, "--type=merge", "-p", patch)


def webhook_takes_event_policies(cluster: Cluster) -> bool:
    """Whether Knative's webhook admits an EventPolicy (it refuses one, "oidc-authentication
    feature not enabled", until it has taken up the feature): a server-side dry run."""
    policy = {
        "apiVersion": "eventing.knative.dev/v1alpha1",
        "kind": "EventPolicy",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"from": [{"sub": "system:serviceaccount:default:probe"}]},
    }
    done = cluster.run_kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(policy))
    if done.returncode != 0 and "oidc-authentication feature not enabled" not in done.stderr:
        raise AssertionError(f"EventPolicy dry run: {done.stderr.strip()}")
    return done.returncode == 0


def clear_eventing_objects(cluster: Cluster) -> None:
    """Delete the Knative objects earlier modules left in the namespace (made with the feature
    off, they would keep no OIDC identity), and wait until their channel is gone too."""
    cluster.kubectl("-n", NAMESPACE, "delete", EVENTING_KINDS, *DELETE_ALL)

    def cleared() -> bool:
        left = cluster.kubectl(
            "-n", NAMESPACE, "get", "subscription,inmemorychannel", "-o", "name", check=False
        )
        return not left.strip()

    wait_until(cleared, "the namespace's Subscriptions and channels deleted", 120, interval=0.5)


def oidc_on(cluster: Cluster) -> None:
    clear_eventing_objects(cluster)
    set_feature(cluster, "enabled")
    wait_until(
        lambda: webhook_takes_event_policies(cluster), "EventPolicies admitted", 60, interval=0.5
    )


# --- what Knative must have given the objects --------------------------------------------


def get_json(cluster: Cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", NAMESPACE, "get", *args, "-o", "json"))


def oidc_gaps(cluster: Cluster, channel_broker: bool = True) -> list[str]:
    """What Knative has not (yet) given the fresh objects for OIDC, each with the hop that
    would then go without a token; empty when every identity and audience is in place.
    ``channel_broker``: the Broker is the channel-based one (its ingress posts to a channel);
    the Kafka Broker has no channel hop."""
    gaps = []
    status = get_json(cluster, "broker", "default").get("status", {})
    audience = (status.get("address") or {}).get("audience")
    if audience != f"eventing.knative.dev/broker/{NAMESPACE}/default":
        gaps.append(f"Broker: status.address.audience {audience!r} (senders need it)")
    if channel_broker and not (status.get("annotations") or {}).get("knative.dev/channelAudience"):
        gaps.append("Broker: no knative.dev/channelAudience (ingress -> channel unauthenticated)")
    applied = {p.get("name") for p in status.get("policies") or []}
    if missing := set(POLICIES) - applied:
        gaps.append(f"Broker: EventPolicies not applied: {sorted(missing)} (has {applied})")
    triggers = get_json(cluster, "trigger")["items"]
    for trigger in triggers:
        name, got = trigger["metadata"]["name"], trigger.get("status", {})
        if not (got.get("auth") or {}).get("serviceAccountName"):
            gaps.append(f"Trigger {name}: no status.auth (filter -> subscriber unauthenticated)")
        if name in TRIGGERS and got.get("subscriberAudience") != FUNCTIONS_AUDIENCE:
            gaps.append(f"Trigger {name}: subscriberAudience {got.get('subscriberAudience')!r}")
    for binding in get_json(cluster, "sinkbinding")["items"]:
        if not (binding.get("status") or {}).get("oidcTokenSecretName"):
            gaps.append(f"SinkBinding {binding['metadata']['name']}: no token Secret yet")
    for channel in get_json(cluster, "inmemorychannel")["items"]:
        subscribers = channel["spec"].get("subscribers") or []
        for sub in subscribers:
            if not (sub.get("auth") or {}).get("serviceAccountName"):
                gaps.append(f"channel subscriber {sub.get('name')}: no auth (dispatcher -> filter)")
            if sub.get("subscriberAudience") != FILTER_AUDIENCE:
                gaps.append(
                    f"channel subscriber {sub.get('name')}: subscriberAudience "
                    f"{sub.get('subscriberAudience')!r} (the dispatcher sends no token without one)"
                )
    return gaps


def probe_event(**extensions: str) -> CloudEvent:
    """An event that no function's Trigger takes; the sink's Trigger takes every event."""
    return CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": PROBE_TYPE,
            "id": f"probe-{uuid.uuid4().hex[:8]}",
            "source": "/tests/sender-auth",
            "datacontenttype": "application/json",
            **extensions,
        },
        data={},
    )


def through_the_broker(secured: Secured, seconds: float = 180) -> list[int]:
    """Until the whole path takes up the feature: the ingress refuses a post without a token
    (401), and an allowed sender's event reaches the sink through the channel's dispatcher and
    the filter (each checking the token of the hop before). The statuses of the probes sent."""
    tokenless: list[int] = []
    while True:
        message = to_binary_event(probe_event(team="main"))
        status = requests.post(
            secured.broker, headers=message.headers, data=message.body, timeout=30
        ).status_code
        if status == 401:
            break
        tokenless.append(status)
        assert len(tokenless) < 60, f"the ingress takes posts without a token: {tokenless}"
        time.sleep(1)
    deadline = time.monotonic() + seconds
    statuses = [*tokenless, status]
    while time.monotonic() < deadline:
        probe = probe_event(team="main")
        statuses.append(secured.post(probe))
        try:
            secured.deployment.sink.wait(timeout=15, id=probe.get_id())
            return statuses
        except AssertionError:
            continue
    raise AssertionError(
        f"no probe reached the sink through the Broker: statuses {statuses}\n"
        + knative_diagnostics(secured.cluster, NAMESPACE, 60)
    )


# --- the deployment ------------------------------------------------------------------------


def tekton_policy_patch() -> dict:
    """The controller's policy as an operator adapts it: the teams it serves here."""
    teams = [{"exact": {"team": team}} for team in PIPELINE_TEAMS]
    return {
        "target": {"kind": "EventPolicy", "name": "broker-tekton-controller"},
        "patch": json.dumps([{"op": "replace", "path": "/spec/filters/2/any", "value": teams}]),
    }


def secure(cluster, knative, images: dict[str, str], s3, sink, tmp, store_of) -> Secured:
    """Turn the feature on, apply the deployment with both components and wait until the
    path takes tokens end to end (``store_of``: the functions' store from its URL)."""
    oidc_on(cluster)
    prefix = f"secured-{uuid.uuid4().hex[:8]}"
    overlay = deployment_overlay(tmp, cluster, knative, images, s3, prefix, [])
    # The components in knative/kustomization.yaml, as a user adds them (its image transformer
    # then reaches their Deployments too); the overlay adapts the controller's policy.
    base = overlay.parent / "knative" / "kustomization.yaml"
    kustomization = yaml.safe_load(base.read_text())
    kustomization["components"] = ["sender-auth", "tekton"]
    base.write_text(yaml.safe_dump(kustomization))
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["patches"].append(tekton_policy_patch())
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    cluster.kubectl("create", "namespace", SENDERS_NAMESPACE, check=False)
    cluster.kubectl("-n", SENDERS_NAMESPACE, "create", "serviceaccount", ENGINE, check=False)
    cluster.kubectl("apply", "-k", str(overlay))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(sink_trigger(sink.url)))
    wait_ready(cluster, NAMESPACE, list(READY))
    deadline = time.monotonic() + 180
    while gaps := oidc_gaps(cluster):
        assert time.monotonic() < deadline, "\n".join(
            ["after 180 s:", *gaps, knative_diagnostics(cluster, NAMESPACE, 60)]
        )
        time.sleep(1)
    wait_functions_serve(cluster, NAMESPACE)
    for deployment in ("reply-relay", "tekton-controller", "tekton-artifacts"):
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{deployment}", "--timeout=300s"
        )
    audience = get_json(cluster, "broker", "default")["status"]["address"]["audience"]
    store = store_of(f"s3://{s3.bucket}/{prefix}")
    deployment = KnativeDeployment(cluster, knative, sink, store, NAMESPACE, s3, overlay)
    secured = Secured(deployment, audience, [])
    secured.probes = through_the_broker(secured)
    return secured
