"""Sender authentication through the Broker on the real cluster (issue 24): Knative Eventing's
``authentication-oidc`` on, ``knative/`` applied with the ``sender-auth`` component.

Who may post for a team is decided by the Broker: the team travels as the event's ``team``
attribute, and the component's EventPolicy lets the pipeline engine of team main
(``system:serviceaccount:ci:pipeline-engine-main``) post events whose team is main. The
function takes deliveries only from the Triggers' identities and binds the attribute to
``build.team``. Senders are pods with a projected token of their ServiceAccount for the
Broker's audience, as a pipeline engine in the cluster has.

Knative gives a Broker, its Triggers and their Subscriptions their OIDC identities and
audiences when it reconciles them with the feature on, and does not go back to objects made
before (the Trigger controller does not resync on a feature change): the module enables the
feature, waits until the webhook honours it, and only then creates the Broker, the Triggers and
the functions afresh (what an earlier run left in the namespace is deleted first). It restores
the feature at the end. The other half, a pod posting straight to a function with its own token
and being refused by the function, is ``test_functions_on_kubernetes.py::
test_with_a_sender_audience_only_allowed_identities_may_send``.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.cli.launch import wait_until
from tests.cluster.conftest import (
    KNATIVE_CACHE_SECRET,
    NAMESPACE,
    KnativeDeployment,
    knative_diagnostics,
    resource_types,
    sink_trigger,
    wait_functions_serve,
    wait_ready,
    write_overlay,
)
from tests.cluster.test_knative_path import (
    assert_reply,
    attributes,
    function_logs,
    reply_to,
    source,
)
from tests.support.events import request_event
from tests.support.runs import run_of

FEATURE = "authentication-oidc"
SENDERS_NAMESPACE = "ci"
ENGINE = "pipeline-engine-main"  # knative/sender-auth/broker-team-policy.yaml names it
INTRUDER = "intruder"  # in the Broker's own namespace: Knative's default mode would let it in
TRIGGERS = ("check-requested", "get-requested", "put-requested")
FILTER_AUDIENCE = "mt-broker-filter"  # Knative's broker filter (pkg/broker/filter)
FUNCTIONS_AUDIENCE = "resource-functions"  # knative/sender-auth/triggers-patch.yaml
POLICIES = ("broker-team-main", "broker-replies")  # the component's, on the Broker
PROBE_TYPE = "dev.resourcefunctions.test.probe"  # no function's Trigger takes it
EVENTING_KINDS = "ksvc,trigger,broker,sinkbinding,pingsource,eventpolicy"
DELETE_ALL = ("--all", "--ignore-not-found", "--wait", "--timeout=300s")
READY = (
    *(f"ksvc/{name}" for name in ("check", "get", "put", "dead-letter")),
    "broker/default",
    "trigger --all",
    "eventpolicy --all",
)


def identity(trigger: str) -> str:
    """The OIDC identity Knative gives a Trigger (pkg/auth, GetOIDCServiceAccountNameForResource)."""
    return f"system:serviceaccount:{NAMESPACE}:{trigger}-oidc-eventing.knative.dev-trigger"


# --- the feature -------------------------------------------------------------------------


def set_feature(cluster, value: str | None) -> None:
    """The feature's value in config-features (None: no value, as a merge patch removes it)."""
    patch = json.dumps({"data": {FEATURE: value}})
    features = ("-n", "knative-eventing", "patch", "configmap", "config-features")
    cluster.kubectl(*features, "--type=merge", "-p", patch)


def feature_value(cluster) -> str | None:
    features = json.loads(
        cluster.kubectl(
            "-n", "knative-eventing", "get", "configmap", "config-features", "-o", "json"
        )
    )
    return (features.get("data") or {}).get(FEATURE)


def webhook_takes_event_policies(cluster) -> bool:
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


def clear_eventing_objects(cluster) -> None:
    """Delete the Knative objects an earlier module left in the namespace (made with the
    feature off, they would keep no OIDC identity), and wait until their Subscriptions and
    channel are gone too."""
    cluster.kubectl("-n", NAMESPACE, "delete", EVENTING_KINDS, *DELETE_ALL)

    def cleared() -> bool:
        left = cluster.kubectl(
            "-n", NAMESPACE, "get", "subscription,inmemorychannel", "-o", "name", check=False
        )
        return not left.strip()

    wait_until(cleared, "the namespace's Subscriptions and channels deleted", 120, interval=0.5)


@pytest.fixture(scope="module")
def oidc_feature(cluster, knative) -> Iterator[None]:
    """``authentication-oidc`` on for this module, once the webhook honours it, on a
    namespace without Knative objects from before; off again (as it was) after."""
    previous = feature_value(cluster)
    clear_eventing_objects(cluster)
    set_feature(cluster, "enabled")
    try:
        wait_until(
            lambda: webhook_takes_event_policies(cluster),
            "EventPolicies admitted",
            60,
            interval=0.5,
        )
        yield
    finally:
        set_feature(cluster, previous)
        wait_until(
            lambda: not webhook_takes_event_policies(cluster),
            "the feature off again",
            60,
            interval=0.5,
        )


# --- senders -----------------------------------------------------------------------------


class Sender:
    """A pod of a ServiceAccount that posts events as a pipeline engine in the cluster would:
    with a projected token of its account for the Broker's audience (busybox ``wget``)."""

    TOKEN = "/var/run/secrets/broker/token"

    def __init__(self, cluster, namespace: str, account: str, image: str, audience: str) -> None:
        self.cluster, self.namespace, self.account = cluster, namespace, account
        self.name = f"sender-{account}-{uuid.uuid4().hex[:6]}"
        token = {"audience": audience, "expirationSeconds": 3600, "path": "token"}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": namespace},
            "spec": {
                "serviceAccountName": account,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "volumes": [
                    {"name": "broker", "projected": {"sources": [{"serviceAccountToken": token}]}}
                ],
                "containers": [
                    {
                        "name": "sender",
                        "image": image,
                        "command": ["sh", "-c", "exec sleep 3600"],
                        "volumeMounts": [
                            {"name": "broker", "mountPath": "/var/run/secrets/broker"}
                        ],
                        "securityContext": {"allowPrivilegeEscalation": False},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        cluster.kubectl(
            "-n", namespace, "wait", "--for=condition=Ready", f"pod/{self.name}", "--timeout=90s"
        )

    def post(self, url: str, event, token: bool = True) -> int:
        """POST ``event`` (binary mode) from the pod; the HTTP status it got."""
        message = to_binary_event(event)
        headers = [f"{name}: {value}" for name, value in message.headers.items()]
        args = " ".join(f"--header {shlex.quote(h)}" for h in headers)
        if token:
            args += f' --header "Authorization: Bearer $(cat {self.TOKEN})"'
        script = f'body=$(cat); wget -S -O /dev/null {args} --post-data "$body" {url} 2>&1'
        exec_in = ("-n", self.namespace, "exec", "-i", self.name, "--")
        done = self.cluster.run_kubectl(*exec_in, "sh", "-c", script, stdin=message.body.decode())
        found = re.search(r"HTTP/1\.[01] (\d{3})", done.stdout)
        assert found, f"no HTTP status from the sender pod: {done.stdout} {done.stderr}"
        return int(found.group(1))

    def delete(self) -> None:
        self.cluster.kubectl(
            "-n", self.namespace, "delete", "pod", self.name, "--wait=false", check=False
        )


@dataclass
class SenderAuth:
    deployment: KnativeDeployment
    engine: Sender  # named by the policy of team main
    intruder: Sender  # named by no policy
    probes: list[int] = field(default_factory=list)  # statuses until the path took it up

    @property
    def broker(self) -> str:
        return self.deployment.broker

    def new_jobs(self, before: set[str]) -> set[str]:
        return {j["metadata"]["name"] for j in self.deployment.jobs()} - before

    def job_names(self) -> set[str]:
        return self.new_jobs(set())


# --- what Knative must have given the objects --------------------------------------------


def get_json(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", NAMESPACE, "get", *args, "-o", "json"))


def oidc_gaps(cluster) -> list[str]:
    """What Knative has not (yet) given the fresh objects for OIDC, each with the hop that
    would then go without a token; empty when every identity and audience is in place."""
    gaps = []
    status = get_json(cluster, "broker", "default").get("status", {})
    audience = (status.get("address") or {}).get("audience")
    if audience != f"eventing.knative.dev/broker/{NAMESPACE}/default":
        gaps.append(f"Broker: status.address.audience {audience!r} (senders need it)")
    if not (status.get("annotations") or {}).get("knative.dev/channelAudience"):
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
    for channel in get_json(cluster, "inmemorychannel")["items"]:
        subscribers = channel["spec"].get("subscribers") or []
        if len(subscribers) != len(triggers):
            gaps.append(f"channel: {len(subscribers)} subscribers for {len(triggers)} Triggers")
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


def through_the_broker(auth: SenderAuth, seconds: float = 180) -> list[int]:
    """Until the whole path takes up the feature: the ingress refuses a post without a token
    (401), and an allowed sender's event reaches the sink through the channel's dispatcher and
    the filter (each checking the token of the hop before). The statuses of the probes sent."""
    sink = auth.deployment.sink
    tokenless = []
    while (status := auth.engine.post(auth.broker, probe_event(), token=False)) != 401:
        tokenless.append(status)
        assert len(tokenless) < 60, f"the ingress takes posts without a token: {tokenless}"
        time.sleep(1)
    deadline = time.monotonic() + seconds
    statuses = [*tokenless, status]
    while time.monotonic() < deadline:
        probe = probe_event(team="main")
        statuses.append(auth.engine.post(auth.broker, probe))
        try:
            sink.wait(timeout=15, id=attributes(probe)["id"])
            return statuses
        except AssertionError:
            continue
    raise AssertionError(
        f"no probe reached the sink through the Broker: statuses {statuses}\n"
        + knative_diagnostics(auth.deployment.cluster, NAMESPACE, 60)
    )


@pytest.fixture(scope="module")
def sender_auth(
    cluster,
    knative,
    oidc_feature,
    cluster_images: dict[str, str],
    gateway_s3,
    event_sink,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SenderAuth]:
    """``knative/`` with the ``sender-auth`` component, applied once the feature is on, the
    sink's Trigger, and the senders' accounts and pods; removed again after the module."""
    from storage import open_store
    from tests.cluster.knative import dev_local

    tmp = tmp_path_factory.mktemp("sender-auth")
    prefix = f"sender-auth-{uuid.uuid4().hex[:8]}"
    overlay = write_overlay(
        tmp,
        image=dev_local(cluster, cluster_images["task"]),
        config={
            "STORE_URL": f"s3://{gateway_s3.bucket}/{prefix}",
            "RESOURCE_TYPES": resource_types(cluster_images["resource"]),
            "LOG_LEVEL": "debug",
        },
        store_env=gateway_s3.env,
        cache_secret=KNATIVE_CACHE_SECRET,
    )
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["components"] = ["../knative/sender-auth"]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    senders: list[Sender] = []
    try:
        cluster.kubectl("apply", "-k", str(overlay))
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(sink_trigger(event_sink.url)))
        cluster.kubectl("create", "namespace", SENDERS_NAMESPACE, check=False)
        cluster.kubectl("-n", SENDERS_NAMESPACE, "create", "serviceaccount", ENGINE, check=False)
        cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", INTRUDER, check=False)
        wait_ready(cluster, NAMESPACE, list(READY))
        wait_functions_serve(cluster, NAMESPACE, sink=False)
        deadline = time.monotonic() + 120
        while gaps := oidc_gaps(cluster):
            assert time.monotonic() < deadline, "\n".join(
                ["after 120 s:", *gaps, knative_diagnostics(cluster, NAMESPACE, 60)]
            )
            time.sleep(1)
        audience = get_json(cluster, "broker", "default")["status"]["address"]["audience"]
        image = cluster_images["resource"]
        senders.append(Sender(cluster, SENDERS_NAMESPACE, ENGINE, image, audience))
        senders.append(Sender(cluster, NAMESPACE, INTRUDER, image, audience))
        with pytest.MonkeyPatch.context() as patch:
            for name, value in gateway_s3.env.items():
                patch.setenv(name, value)
            store = open_store(f"s3://{gateway_s3.bucket}/{prefix}")
            deployment = KnativeDeployment(
                cluster, knative, event_sink, store, NAMESPACE, gateway_s3, overlay
            )
            auth = SenderAuth(deployment, *senders)
            auth.probes = through_the_broker(auth)
            yield auth
    finally:
        for sender in senders:
            sender.delete()
        cluster.kubectl("-n", NAMESPACE, "delete", EVENTING_KINDS, *DELETE_ALL, check=False)
        cluster.kubectl("delete", "namespace", SENDERS_NAMESPACE, "--wait=false", check=False)
        cluster.kubectl(
            "-n", NAMESPACE, "delete", "configmap", "resource-functions-config", check=False
        )


# --- the tests -----------------------------------------------------------------------------


def check_for(team: str, attribute: str | None = None):
    """A check request naming ``team`` in build.team, with the ``team`` attribute
    ``attribute`` (the same team unless given)."""
    build = {"id": "1", "name": "1", "job": "unit", "pipeline": "p", "team": team}
    return request_event(
        "check",
        {"type": "test", "source": source(), "build": build},
        team=attribute or team,
    )


def run_jobs(auth: SenderAuth, event, team: str) -> list[dict]:
    """The Jobs of ``event``'s run as the check function names it when the check Trigger
    relays it for ``team``: the run id is keyed by the sender the function saw."""
    got = attributes(event)
    run = run_of(
        KNATIVE_CACHE_SECRET,
        got["source"],
        got["id"],
        "check",
        sender=identity("check-requested"),
        team=team,
    )
    return auth.deployment.jobs(**{"resource-functions.dev/run-id": run})


def assert_never_entered(auth: SenderAuth, event, jobs_before: set[str]) -> None:
    """The Broker never took ``event``: an allowed event sent after it reaches the sink,
    which sees every event the Broker takes (its Trigger has no filter), and ``event`` is
    not there; no Job started."""
    marker = probe_event(team="main")
    assert auth.engine.post(auth.broker, marker) == 202
    auth.deployment.sink.wait(timeout=60, id=attributes(marker)["id"])
    assert auth.deployment.sink.matching(id=attributes(event)["id"]) == []
    assert auth.new_jobs(jobs_before) == set()


def test_a_teams_sender_is_answered_and_the_function_sees_the_trigger(sender_auth, capsys):
    """The engine of team main, with its token for the Broker's audience, posts a check for
    main: the Broker takes it, the check Trigger delivers it with its own token, the function
    runs it under that identity (the run id is keyed by it) and the reply comes back through
    the Broker (its policy for the Triggers' replies)."""
    auth = sender_auth
    check = check_for("main")
    assert auth.engine.post(auth.broker, check) == 202
    data = assert_reply(reply_to(auth.deployment, check, "check"), check, "check")
    assert data["versions"] == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]
    assert len(run_jobs(auth, check, "main")) == 1
    with capsys.disabled():
        print(f"\n[sender-auth] probes until the path took up the feature: {auth.probes}")


def test_the_same_sender_naming_another_team_is_refused_by_the_broker(sender_auth):
    auth = sender_auth
    before = auth.job_names()
    blue = check_for("blue")
    assert auth.engine.post(auth.broker, blue) == 403
    assert_never_entered(auth, blue, before)


def test_an_account_no_policy_names_is_refused_by_the_broker(sender_auth):
    """An account of the Broker's own namespace, which Knative's default mode
    (allow-same-namespace) would let in without the team policy; and no token at all."""
    auth = sender_auth
    before = auth.job_names()
    intruding = check_for("main")
    assert auth.intruder.post(auth.broker, intruding) == 403
    tokenless = check_for("main")
    assert auth.engine.post(auth.broker, tokenless, token=False) == 401
    for event in (intruding, tokenless):
        assert_never_entered(auth, event, before)


def test_a_team_attribute_unlike_build_team_is_refused_by_the_function(sender_auth):
    """The Broker decides by the attribute alone: an allowed sender that names main there and
    blue in build.team gets past it, and the function refuses the request (400, nothing runs;
    the Broker dead-letters it)."""
    auth = sender_auth
    before = auth.job_names()
    lying = check_for("blue", attribute="main")
    assert auth.engine.post(auth.broker, lying) == 202
    event_id = attributes(lying)["id"]
    logs = wait_until(
        lambda: event_id in (text := function_logs(auth.deployment, "dead-letter")) and text,
        "dead-lettered",
        150,
        interval=0.5,
    )
    assert "undeliverable event" in next(line for line in logs.splitlines() if event_id in line)
    refusal = "the event's 'team' attribute ('main') must equal build.team ('blue')"
    assert refusal in function_logs(auth.deployment, "check")
    assert auth.new_jobs(before) == set()
    assert [e for e in auth.deployment.sink.matching(requestid=event_id)] == []
