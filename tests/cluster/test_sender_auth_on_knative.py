"""Sender authentication through the Broker on the real cluster (issues 24, 39), on the
``secured`` deployment (``tests/cluster/secured.py``): Knative Eventing's
``authentication-oidc`` on, ``knative/`` applied with the ``sender-auth`` component (and the
``tekton`` one), NetworkPolicies enforced.

Who may post for a team is decided by the Broker: the team travels as the event's ``team``
attribute, and the component's EventPolicy lets the pipeline engine of team main
(``system:serviceaccount:ci:pipeline-engine-main``) post events whose team is main. The
function takes deliveries only from the Triggers' identities and binds the attribute to
``build.team``. Senders are pods with a projected token of their ServiceAccount for the
Broker's audience, as a pipeline engine in the cluster has. Replies stay asynchronous: the
task's collect step posts through the reply relay, which posts into the Broker with its
SinkBinding's token. The other half, a pod posting straight to a function with its own token
and being refused by the function, is ``test_functions_on_kubernetes.py::
test_with_a_sender_audience_only_allowed_identities_may_send``.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cloudevents.core.bindings.http import to_binary_event

from functions.cli.launch import wait_until
from tests.cluster.conftest import KNATIVE_CACHE_SECRET, NAMESPACE, KnativeDeployment
from tests.cluster.secured import ENGINE, SENDERS_NAMESPACE, Secured, identity, probe_event
from tests.cluster.test_knative_path import (
    assert_reply,
    attributes,
    function_logs,
    ran_warm,
    reply_to,
    source,
)
from tests.support.events import request_event
from tests.support.runs import run_of

INTRUDER = "intruder"  # in the Broker's own namespace: Knative's default mode would let it in


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
    secured: Secured
    engine: Sender  # named by the policy of team main
    intruder: Sender  # named by no policy

    @property
    def deployment(self) -> KnativeDeployment:
        return self.secured.deployment

    @property
    def broker(self) -> str:
        return self.deployment.broker

    @property
    def probes(self) -> list[int]:
        return self.secured.probes

    def new_jobs(self, before: set[str]) -> set[str]:
        return {j["metadata"]["name"] for j in self.deployment.jobs()} - before

    def job_names(self) -> set[str]:
        return self.new_jobs(set())


@pytest.fixture(scope="module")
def sender_auth(secured: Secured, cluster_images: dict[str, str]) -> Iterator[SenderAuth]:
    """The senders' pods: team main's engine and an account no policy names."""
    cluster = secured.cluster
    cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", INTRUDER, check=False)
    image = cluster_images["resource"]
    senders: list[Sender] = []
    try:
        senders.append(Sender(cluster, SENDERS_NAMESPACE, ENGINE, image, secured.audience))
        senders.append(Sender(cluster, NAMESPACE, INTRUDER, image, secured.audience))
        yield SenderAuth(secured, *senders)
    finally:
        for sender in senders:
            sender.delete()


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


def check_run(event, team: str) -> str:
    """``event``'s run id as the check function names it when the check Trigger relays it
    for ``team``: keyed by the sender the function saw."""
    got = attributes(event)
    return run_of(
        KNATIVE_CACHE_SECRET,
        got["source"],
        got["id"],
        "check",
        sender=identity("check-requested"),
        team=team,
    )


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
    assert ran_warm(auth.deployment, check_run(check, "main"))  # under the Trigger's identity
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
