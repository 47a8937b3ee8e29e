"""Sender authentication on the production path: Knative Eventing's ``authentication-oidc``
turned on, ``knative/`` applied with the ``sender-auth`` component. The Broker's Triggers
deliver with tokens for the functions' audience and their replies come back through the
Broker; a pod posting straight to a function is refused. Runs after test_knative_path.py (it
changes the installation for the rest of the session)."""

from __future__ import annotations

import json
import time

import yaml

from tests.cluster.conftest import NAMESPACE, wait_functions_serve
from tests.cluster.test_functions_on_kubernetes import pod_output, post_from_pod
from tests.cluster.test_knative_path import assert_reply, reply_to, source
from tests.e2e.events import ENCODERS, request_event


def wait_until(probe, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (value := probe()):
        assert time.monotonic() < deadline, f"not {what} after {seconds}s"
        time.sleep(1)
    return value


def test_only_the_triggers_may_deliver_once_sender_auth_is_on(knative_deployment, cluster_images):
    import requests

    d = knative_deployment
    cluster = d.cluster
    cluster.kubectl(
        "-n",
        "knative-eventing",
        "patch",
        "configmap",
        "config-features",
        "--type",
        "merge",
        "-p",
        json.dumps({"data": {"authentication-oidc": "enabled"}}),
    )
    # The data plane reads the feature at start-up (in a long session the channel dispatcher
    # went on posting without tokens): restart it, as an operator enabling the feature would.
    data_plane = ("imc-dispatcher", "mt-broker-filter", "mt-broker-ingress")
    for name in data_plane:
        cluster.kubectl("-n", "knative-eventing", "rollout", "restart", f"deployment/{name}")
    for name in data_plane:
        cluster.kubectl(
            "-n", "knative-eventing", "rollout", "status", f"deployment/{name}", "--timeout=180s"
        )
    # The deployment again, with the component: a copy of the overlay the fixture applied.
    overlay = d.overlay
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["components"] = ["../knative/sender-auth"]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    cluster.kubectl("apply", "-k", str(overlay))
    cluster.kubectl("-n", NAMESPACE, "delete", "sinkbinding", "function-replies", check=False)

    def triggers_have_identities() -> bool:
        listed = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "trigger", "-o", "json"))
        ours = [t for t in listed["items"] if t["metadata"]["name"].endswith("-requested")]
        return len(ours) == 3 and all(
            (t.get("status", {}).get("auth") or {}).get("serviceAccountName")
            and t["status"].get("subscriberAudience") == "resource-functions"
            for t in ours
        )

    wait_until(triggers_have_identities, 180, "Triggers with OIDC identities")

    wait_functions_serve(cluster, NAMESPACE, sink=False)
    broker = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "broker", "default", "-o", "json"))
    audience = broker["status"]["address"].get("audience")
    assert audience, broker["status"]["address"]
    token = cluster.kubectl(
        "-n", NAMESPACE, "create", "token", "default", f"--audience={audience}"
    ).strip()

    def subscriptions_have_identities() -> bool:
        listed = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "subscription", "-o", "json"))
        return bool(listed["items"]) and all(
            (s.get("status", {}).get("auth") or {}).get("serviceAccountName")
            for s in listed["items"]
        )

    # The Broker's channel subscriptions (channel -> filter) get identities too.
    wait_until(subscriptions_have_identities, 180, "channel subscriptions with OIDC identities")

    def answered_through_the_broker() -> dict | None:
        """A check posted with a token for the Broker's audience, answered through the
        Triggers; None while the components are still taking up the feature (the channel's
        dispatcher posts without a token at first, which the filter refuses for good)."""
        check = request_event("check", {"type": "test", "source": source()}, subject="oidc/repo")
        message = ENCODERS["binary"](check)
        posted = requests.post(
            d.broker,
            headers={**message.headers, "Authorization": f"Bearer {token}"},
            data=message.body,
            timeout=60,
        )
        assert posted.status_code == 202, posted.text
        try:
            return assert_reply(reply_to(d, check, "check", timeout=60), check, "check")
        except AssertionError:
            return None

    data = wait_until(answered_through_the_broker, 300, "a check answered through the Broker")
    assert data["versions"][-1] == {"ref": "3"}

    # A pod posting straight to the function, past the Broker: refused.
    url = f"http://check.{NAMESPACE}.svc.cluster.local"
    assert "401" in pod_output(cluster, cluster_images["resource"], post_from_pod(url))
