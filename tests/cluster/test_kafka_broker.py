"""Durable delivery (issue 42): the functions' Broker on Knative's Apache Kafka Broker, on the
real cluster, with the production path's security on (the ``secured`` deployment:
``authentication-oidc``, the ``sender-auth`` and ``tekton`` components, NetworkPolicies).

The module adds the shipped ``knative/kafka`` component to that deployment as an operator
does: the Broker's class cannot change, so the Broker and its Triggers are deleted and the
deployment applied again; the component's ConfigMap names this cluster's Kafka (one node, a
pod where the component's NetworkPolicy expects it: replication factor 1) and its credentials'
Secret is created. Then Kafka's fence and authentication, the path (check, get, put with replies,
``version.discovered`` to its Triggers, the senders' policy, the dead letter), the Tekton git
example with its new-versions hop on a KafkaChannel, and the faults:
while requests flow, the receiver pod, the dispatcher pod, the Kafka process and the
functions' pods restart, and every accepted request runs once and is answered once.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import requests
import yaml
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.cli.launch import wait_until
from tests.cluster.conftest import (
    KNATIVE_CACHE_SECRET,
    NAMESPACE,
    sink_trigger,
    wait_functions_serve,
    wait_ready,
)
from tests.cluster.counter import Counter
from tests.cluster.git_example import (
    NEW_VERSIONS,
    USERS,
    a_commit_is_built_once,
    applied_example,
    served_repository,
)
from tests.cluster.kafka_broker import (
    DISPATCHER,
    INGRESS,
    KAFKA_HEAP,
    KAFKA_NAMESPACE,
    RECEIVER,
    SYSTEM,
    KafkaBroker,
)
from tests.cluster.probes import connects_from, reachable_from, run_pod
from tests.cluster.secured import (
    PROBE_TYPE as PROBE,
)
from tests.cluster.secured import (
    READY,
    TEAM_LABEL,
    Secured,
    get_json,
    identity,
    oidc_gaps,
    probe_event,
    through_the_broker,
)
from tests.cluster.test_knative_figures import container_memory
from tests.cluster.test_knative_path import (
    assert_reply,
    attributes,
    function_logs,
    ran_warm,
    reply_to,
    source,
)
from tests.cluster.timeline import percentile
from tests.support.bench import size
from tests.support.events import request_event
from tests.support.runs import run_of

# The first test's setup moves the deployment to the Kafka Broker (minutes; run alone, it
# also brings up the cluster, Knative, Tekton and the secured deployment).
pytestmark = pytest.mark.timeout(2400)
TOPIC_PARTITIONS = "4"
BUILD = {"id": "9", "name": "9", "job": "unit", "pipeline": "p", "team": "main"}
FENCED = "kafka-fence"  # a pipeline team's namespace
KAFKA_CREDENTIALS = "resource-functions-kafka-auth"  # the component's ConfigMap names it
FUNCTIONS = "serving.knative.dev/service in (check,get,put)"
TEKTON_NAMESPACES = (USERS,)  # shown by conftest when a test fails


def kafka_component(secured: Secured, kafka: KafkaBroker) -> None:
    """Add ``kafka`` to the applied copy of knative/'s components, patch its ConfigMap to this
    cluster's Kafka (one node: replication factor 1; its bootstrap servers and the Kafka pods
    its NetworkPolicy fences are the shipped ones), and create its credentials' Secret, as
    an operator edits ``knative/kafka/configmap.yaml`` and fills in
    ``knative/credentials/kafka-credentials.yaml``."""
    overlay = secured.deployment.overlay
    base = overlay.parent / "knative" / "kustomization.yaml"
    kustomization = yaml.safe_load(base.read_text())
    kustomization["components"] = [*kustomization.get("components", []), "kafka"]
    base.write_text(yaml.safe_dump(kustomization))
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "resource-functions-kafka", "namespace": NAMESPACE},
        "data": {
            "default.topic.partitions": TOPIC_PARTITIONS,
            "default.topic.replication.factor": "1",
        },
    }
    (overlay / "kafka-config.yaml").write_text(yaml.safe_dump(config))
    secured.cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(kafka.kafka.credentials(NAMESPACE, KAFKA_CREDENTIALS)),
    )
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["patches"].append({"path": "kafka-config.yaml"})
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


@pytest.fixture(scope="module")
def on_kafka(secured: Secured, kafka_broker: KafkaBroker) -> Secured:
    cluster = secured.cluster
    kafka_component(secured, kafka_broker)
    # A Broker's class is fixed at creation: the Triggers (their Subscriptions are the
    # channel broker's), the Broker and the SinkBindings that name it (they do not look at
    # the Broker again once it went: "address not set" for good) go, and come back with the
    # deployment.
    delete = ("--ignore-not-found", "--wait", "--timeout=300s")
    cluster.kubectl("-n", NAMESPACE, "delete", "trigger", "--all", *delete)
    cluster.kubectl("-n", NAMESPACE, "delete", "sinkbinding", "--all", *delete)
    cluster.kubectl("-n", NAMESPACE, "delete", "broker", "default", *delete)
    cluster.kubectl("apply", "-k", str(secured.deployment.overlay))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(sink_trigger(secured.deployment.sink.url)))
    wait_ready(cluster, NAMESPACE, list(READY))
    deadline = time.monotonic() + 180
    while gaps := oidc_gaps(cluster, channel_broker=False):
        assert time.monotonic() < deadline, "\n".join(["after 180 s:", *gaps])
        time.sleep(1)
    # The SinkBindings name the new Broker's address: the functions (a new revision each, its
    # Route moved onto it) and the Deployments they bind roll out with it (a reply relay still
    # posting to the old Broker would lose replies; a Route still on the revision before would
    # hold requests for a revision that is going away).
    wait_functions_serve(cluster, NAMESPACE, sink_value=INGRESS)
    for deployment in ("reply-relay", "tekton-controller"):
        wait_until(
            lambda name=deployment: INGRESS in sink_of(cluster, name),
            f"{deployment} bound to the Kafka Broker",
            180,
            interval=1,
        )
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{deployment}", "--timeout=300s"
        )
    audience = get_json(cluster, "broker", "default")["status"]["address"]["audience"]
    knative = dataclasses.replace(secured.deployment.knative, broker_ingress=kafka_broker.ingress)
    deployment = dataclasses.replace(secured.deployment, knative=knative)
    dispatcher_rebuilt(kafka_broker, trigger_names(cluster))
    on = Secured(deployment, audience, [])
    on.probes = through_the_broker(on)
    each_trigger_delivers(on)
    return on


def trigger_names(cluster) -> list[str]:
    listed = cluster.kubectl("-n", NAMESPACE, "get", "triggers", "-o", "name").split()
    return [name.rsplit("/", 1)[1] for name in listed]


def dispatcher_rebuilt(kafka: KafkaBroker, names: list[str], seconds: float = 180) -> None:
    """Once the dispatcher's contract names the OIDC service account of each Trigger of
    ``names``, restart it. It builds a Trigger's senders from the contract it has when they
    start, and one built before the account was there sends without a token, straight to the
    dead letter, until it is rebuilt (seen: put-requested's sender of one partition failing
    "no OIDC service account set in client yet" 6 s after another partition's delivered with
    its token)."""

    def named() -> bool:
        accounts = kafka.dispatcher_accounts(NAMESPACE)
        return bool(names) and all(accounts.get(name) for name in names)

    wait_until(
        named, f"the dispatcher's contract naming the accounts of {names}", seconds, interval=2
    )
    kafka.restart_pods(SYSTEM, f"app={DISPATCHER}")


def each_trigger_delivers(on: Secured, seconds: float = 180) -> None:
    """Until each function's Trigger delivers to its function (the dispatcher just restarted:
    its consumers join their groups again). Per action, a ``refused_request`` is posted again
    until a reply comes back from the function."""
    deadline = time.monotonic() + seconds
    for action in ("check", "get", "put"):
        posted: list[str] = []
        while True:
            probe = refused_request(action)
            assert on.post(probe) == 202
            posted.append(attributes(probe)["id"])
            try:
                on.deployment.sink.wait(timeout=15, requestid=posted[-1])
                break
            except AssertionError:
                assert time.monotonic() < deadline, f"{action}: no reply to any of {posted}"


def run_id(event) -> str:
    """``event``'s run id: with sender authentication on, keyed by the sender the function
    saw, its action's Trigger."""
    got = attributes(event)
    action = got["type"].split(".")[2]
    sender = identity(f"{action}-requested")
    return run_of(
        KNATIVE_CACHE_SECRET, got["source"], got["id"], action, sender=sender, team="main"
    )


def jobs_of(deployment, event) -> list[dict]:
    return deployment.jobs(**{"resource-functions.dev/run-id": run_id(event)})


def sink_of(cluster, deployment: str) -> str:
    """The K_SINK a SinkBinding gave the Deployment's pod template ("" while none)."""
    spec = get_json(cluster, "deployment", deployment)["spec"]["template"]["spec"]
    env = [e for c in spec["containers"] for e in c.get("env") or [] if e["name"] == "K_SINK"]
    return env[0].get("value", "") if env else ""


def team_request(action: str, data: dict):
    return request_event(action, {"type": "test", "build": BUILD, **data}, team="main")


def test_the_broker_is_kafka_and_check_get_put_reply_through_it(on_kafka: Secured):
    broker = get_json(on_kafka.cluster, "broker", "default")
    assert broker["metadata"]["annotations"]["eventing.knative.dev/broker.class"] == "Kafka"
    assert "kafka-broker-ingress" in broker["status"]["address"]["url"]
    d = on_kafka.deployment
    src = source()
    check = team_request("check", {"source": src})
    assert on_kafka.post(check) == 202
    versions = assert_reply(reply_to(d, check, "check"), check, "check")["versions"]
    assert versions == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]
    # The check's new versions went back into the Broker to their Triggers (the sink's is one).
    discovered = d.sink.matching(requestid=attributes(check)["id"])
    assert any(attributes(e)["type"].endswith(".discovered") for e in discovered)

    get = team_request("get", {"source": src, "version": versions[-1]})
    assert on_kafka.post(get) == 202
    artifact = assert_reply(reply_to(d, get, "get"), get, "get")["artifact"]
    put = team_request(
        "put", {"source": src, "params": {"input": "in"}, "inputs": {"in": artifact["url"]}}
    )
    assert on_kafka.post(put) == 202
    assert assert_reply(reply_to(d, put, "put"), put, "put")["version"] == {"ref": "pushed-3"}
    assert ran_warm(d, run_id(check))  # as shipped: WARM_CHECKS=on
    assert len(jobs_of(d, get)) == len(jobs_of(d, put)) == 1


def test_the_kafka_receiver_holds_the_senders_policy(on_kafka: Secured):
    """No token: 401; the engine of team main naming team blue: 403 (its EventPolicy); an
    allowed marker posted after both reaches the sink, and neither of them does."""
    message = to_binary_event(probe_event(team="main"))
    tokenless = requests.post(on_kafka.broker, headers=message.headers, data=message.body)
    assert tokenless.status_code == 401
    blue = probe_event(team="blue")
    assert on_kafka.post(blue) == 403
    marker = probe_event(team="main")
    assert on_kafka.post(marker) == 202
    on_kafka.deployment.sink.wait(timeout=60, id=attributes(marker)["id"])
    assert on_kafka.deployment.sink.matching(id=attributes(blue)["id"]) == []


def test_a_request_the_function_refuses_is_dead_lettered(on_kafka: Secured):
    d = on_kafka.deployment
    lying = request_event(
        "check",
        {"type": "test", "source": source(), "build": {**BUILD, "team": "blue"}},
        team="main",
    )
    assert on_kafka.post(lying) == 202
    event_id = attributes(lying)["id"]
    logs = wait_until(
        lambda: event_id in (text := function_logs(d, "dead-letter")) and text,
        "dead-lettered",
        150,
        interval=0.5,
    )
    assert "undeliverable event" in next(line for line in logs.splitlines() if event_id in line)


def test_a_pipeline_namespace_reaches_not_the_kafka_receiver(
    on_kafka: Secured, cluster_images: dict[str, str]
):
    """The tekton component's fence holds for the Kafka Broker's receiver too: a pod of a
    team's namespace (a Task step) reaches the artifacts service (the control) and not the
    receiver, where it could post requests, replies or discovered versions of its choosing."""
    cluster = on_kafka.cluster
    cluster.kubectl("create", "namespace", FENCED, check=False)
    cluster.kubectl("label", "namespace", FENCED, f"{TEAM_LABEL}={FENCED}", "--overwrite")
    artifacts = f"http://tekton-artifacts.{NAMESPACE}.svc.cluster.local/healthz"
    receiver = f"http://{INGRESS}.{SYSTEM}.svc.cluster.local/{NAMESPACE}/default"
    found, said = reachable_from(cluster, FENCED, cluster_images["task"], [artifacts, receiver])
    assert found == {artifacts: True, receiver: False}, said


KAFKA_CLIENT = """
set -uf
bootstrap={bootstrap}
java_="java -XX:+UseSerialGC -Xmx96m -cp /app/libs/*"
jaas="org.apache.kafka.common.security.scram.ScramLoginModule required"
limits="request.timeout.ms=5000\ndefault.api.timeout.ms=10000\nmax.block.ms=10000\n"
printf "security.protocol=PLAINTEXT\n$limits" > /tmp/none.properties
for who in wrong right; do
  password=$(cat /auth/password); [ "$who" = wrong ] && password=not-the-password
  printf "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n$limits" > /tmp/$who.properties
  printf 'sasl.jaas.config=%s username="%s" password="%s";\n' "$jaas" "$(cat /auth/user)" "$password" >> /tmp/$who.properties
done
for who in none wrong; do
  echo "--- produce as $who"
  echo forged | $java_ kafka.tools.ConsoleProducer --bootstrap-server $bootstrap \
    --topic {topic} --sync --producer.config /tmp/$who.properties 2>&1 | tail -n 5
done
echo "--- topics as right"
$java_ org.apache.kafka.tools.TopicCommand --bootstrap-server $bootstrap --list \
  --command-config /tmp/right.properties 2>&1 | tail -n 20
"""


def test_kafka_takes_only_knatives_kafka_pods_and_only_with_credentials(
    on_kafka: Secured, kafka_broker: KafkaBroker, cluster_images: dict[str, str]
):
    """Kafka is fenced and authenticated (the kafka component's NetworkPolicy and SASL/SCRAM,
    issue 50): a pod of a team's namespace cannot open a connection to Kafka's bootstrap port
    (the artifacts service is the control); a pod the network does admit (in Kafka's own
    namespace) cannot write into the Broker's topic without credentials or with wrong
    ones, while the Kafka Broker's credentials list the topics."""
    cluster = on_kafka.cluster
    cluster.kubectl("create", "namespace", FENCED, check=False)
    cluster.kubectl("label", "namespace", FENCED, f"{TEAM_LABEL}={FENCED}", "--overwrite")
    kafka = kafka_broker.kafka.bootstrap
    artifacts = f"tekton-artifacts.{NAMESPACE}.svc.cluster.local:80"
    found, said = connects_from(cluster, FENCED, cluster_images["task"], [artifacts, kafka])
    assert found == {artifacts: True, kafka: False}, said

    topic = f"knative-broker-{NAMESPACE}-default"
    script = KAFKA_CLIENT.format(bootstrap=kafka, topic=topic)
    said = run_pod(
        cluster,
        KAFKA_NAMESPACE,
        kafka_broker.kafka.image,
        ["/bin/sh", "-c", script],
        volumes=[{"name": "auth", "secret": {"secretName": "my-cluster-kafka-scram"}}],
        mounts=[{"name": "auth", "mountPath": "/auth"}],
        timeout=240,
    )
    parts = dict(part.split("\n", 1) for part in said.split("--- ")[1:])
    assert "TimeoutException" in parts["produce as none"], said
    assert "Authentication failed" in parts["produce as wrong"], said
    assert topic in parts["topics as right"].split(), said


# --- the Tekton example, its channel hop a KafkaChannel ---------------------------------------

KAFKA_CHANNEL = {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel"}


@pytest.fixture(scope="module")
def kafka_example(
    on_kafka: Secured, kafka_broker: KafkaBroker, tekton, real_resource_images, tmp_path_factory
):
    """The Tekton git example (``git_example.py``) applied on the Kafka Broker as on the
    in-memory one, but for its new-versions hop: a KafkaChannel, as the example says to use
    where events must survive a restart. Its Trigger is new: the dispatcher is rebuilt once
    its contract names the Trigger's OIDC account (the channel's Subscription posts to the
    listener's plain URI: no token). The example's repository and CustomTask."""
    cluster = on_kafka.cluster
    with served_repository(tmp_path_factory.mktemp("git-example")) as repository:
        workdir = tmp_path_factory.mktemp("examples")
        with applied_example(
            cluster, on_kafka, tekton, repository, workdir, KAFKA_CHANNEL
        ) as example:
            channel = get_json(cluster, "kafkachannel", NEW_VERSIONS)  # the hop's kind
            assert {"type": "Ready", "status": "True"}.items() <= next(
                c for c in channel["status"]["conditions"] if c["type"] == "Ready"
            ).items()
            dispatcher_rebuilt(kafka_broker, trigger_names(cluster))
            yield example, repository


def test_the_tekton_example_runs_on_the_kafka_broker_through_a_kafka_channel(
    kafka_example, on_kafka: Secured
):
    """The example's whole story (git_example.a_commit_is_built_once) with every hop durable:
    the ticks' requests and replies through the Kafka Broker, each new version through the
    KafkaChannel to the EventListener: one PipelineRun per new commit, no volume claim, no
    store key in the pipeline namespace."""
    example, repository = kafka_example
    a_commit_is_built_once(example, repository, on_kafka, ticks="kafka-tick")


# --- faults --------------------------------------------------------------------------------


def post_until_accepted(
    url: str, token: str, event, seconds: float, pause: float, timeout: float
) -> tuple[float | None, list[str]]:
    """POST ``event`` (binary mode, with ``token``) again after each refusal or failure, a
    ``pause`` apart, until the Broker accepts it (202) or ``seconds`` pass: when the accepted
    post started (None: never), and what each refused attempt got."""
    message = to_binary_event(event)
    headers = {**message.headers, "Authorization": f"Bearer {token}"}
    deadline, refusals = time.monotonic() + seconds, []
    while True:
        posted = time.monotonic()
        try:
            status = requests.post(url, headers=headers, data=message.body, timeout=timeout)
        except requests.RequestException as error:
            refusals.append(type(error).__name__)
        else:
            if status.status_code == 202:
                return posted, refusals
            refusals.append(str(status.status_code))
        if time.monotonic() >= deadline:
            return None, refusals
        time.sleep(pause)


class Stream:
    """Check requests posted one after another, each until the Broker accepts it (202): a
    refused or failed post is the sender's to retry, an accepted one is the Broker's. Each
    check's script reads its own URL of ``repository`` once a run: its runs, counted there
    whether a warm pod or a Job ran it."""

    def __init__(self, on: Secured, repository: Counter) -> None:
        self.on = on
        self.repository = repository
        self.urls: dict[str, str] = {}  # the count_url of each accepted request, by its id
        self.token = on.token("pipeline-engine-main", "ci")
        self.accepted: list = []
        self.refusals: list[str] = []

    def post_one(self, deadline: float) -> None:
        url = self.repository.url_for(uuid.uuid4().hex)
        event = team_request("check", {"source": source(count_url=url)})
        seconds = deadline - time.monotonic()
        posted, refusals = post_until_accepted(self.on.broker, self.token, event, seconds, 1, 30)
        self.refusals += refusals
        assert posted is not None, f"not accepted: {self.refusals[-10:]}"
        self.accepted.append(event)
        self.urls[attributes(event)["id"]] = url

    def during(self, fault: Callable[[], None], before: int, meanwhile: int) -> None:
        """``before`` requests, then ``fault`` in a thread while ``meanwhile`` more go."""
        deadline = time.monotonic() + 300
        for _ in range(before):
            self.post_one(deadline)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                fault()
            except Exception as error:  # noqa: BLE001 - reported by the test below
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        for _ in range(meanwhile):
            self.post_one(deadline)
            time.sleep(0.5)
        thread.join(timeout=400)
        assert not thread.is_alive() and not errors, errors


def test_no_accepted_request_is_lost_or_run_twice_when_a_piece_restarts(
    on_kafka: Secured, kafka_broker: KafkaBroker, secured: Secured, counted, capsys
):
    stream = Stream(on_kafka, counted)
    faults = {
        "receiver": lambda: kafka_broker.restart_pods(SYSTEM, f"app={RECEIVER}"),
        "dispatcher": lambda: kafka_broker.restart_pods(SYSTEM, f"app={DISPATCHER}"),
        "kafka": kafka_broker.restart_kafka,
        "functions": lambda: kafka_broker.restart_pods(NAMESPACE, FUNCTIONS, wait=False),
    }
    for fault in faults.values():
        stream.during(fault, before=2, meanwhile=4)
    d = on_kafka.deployment
    missing, repeated = [], []
    for event in stream.accepted:
        reply = reply_to(d, event, "check", timeout=300)
        assert_reply(reply, event, "check")
        runs = counted.reads(stream.urls[attributes(event)["id"]])
        if runs != 1:
            repeated.append((attributes(event)["id"], runs))
    time.sleep(10)  # a second reply would come within the Broker's first retries
    for event in stream.accepted:
        replies = {
            attributes(e)["id"]
            for e in d.sink.matching(requestid=attributes(event)["id"])
            if not attributes(e)["type"].endswith(".discovered")
        }
        if len(replies) != 1:
            missing.append((attributes(event)["id"], sorted(replies)))
    assert missing == [] and repeated == []
    with capsys.disabled():
        print(
            f"\n[kafka] {len(stream.accepted)} requests through 4 restarts "
            f"({', '.join(faults)}): all answered once; refused posts "
            f"{len(stream.refusals)} ({sorted(set(stream.refusals))})"
        )


# --- figures: the Kafka Broker against the in-memory channel, in one run ---------------------

IN_MEMORY = "in-memory"
FIGURES_ACCOUNT = "broker-figures"  # of the Brokers' namespace: the in-memory one's default
IMC_PIECES = {
    "broker ingress": "eventing.knative.dev/brokerRole=ingress",
    "broker filter": "eventing.knative.dev/brokerRole=filter",
    "channel dispatcher": "messaging.knative.dev/role=dispatcher",
}


class Probes:
    """Events posted to one Broker at a steady rate, each until accepted, and their latency
    from the accepted post to the sink, and which never arrived. By default probe events (no
    function's Trigger takes them; the sink's takes all), timed to their own arrival; with
    ``request``, requests, timed to their reply's arrival (its ``requestid``)."""

    def __init__(
        self, sink, url: str, token: str, request: Callable[[], CloudEvent] | None = None
    ) -> None:
        self.sink, self.url, self.token = sink, url, token
        self.request = request
        self.posted: dict[str, float] = {}
        self.refused = 0

    def run(self, count: int, rate: float) -> None:
        for _ in range(count):
            started = time.monotonic()
            event = self.request() if self.request else probe_event(team="main")
            # 30 s at most, then the event counts as refused
            posted, refusals = post_until_accepted(self.url, self.token, event, 30, 0.5, 10)
            self.refused += len(refusals)
            if posted is not None:
                self.posted[attributes(event)["id"]] = posted
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))

    def arrivals(self) -> list[tuple[str, CloudEvent]]:
        """Each event at the sink that is one of ours, as often as it arrived, with its key:
        a probe's id, a reply's requestid."""
        events = self.sink.matching() if self.request else self.sink.matching(type=PROBE)
        key = "requestid" if self.request else "id"
        return [(k, e) for e in events if (k := attributes(e).get(key)) in self.posted]

    def repeated(self) -> int:
        """Arrivals beyond the first of the same event (at-least-once delivery's repeats)."""
        keys = [key for key, _ in self.arrivals()]
        return len(keys) - len(set(keys))

    def latencies(self, wait: float = 60) -> tuple[list[float], list[str]]:
        deadline = time.monotonic() + wait
        found: dict[str, float] = {}
        while True:
            for got, event in self.arrivals():
                if got not in found:
                    found[got] = self.sink.arrival(event) - self.posted[got]
            if len(found) == len(self.posted) or time.monotonic() > deadline:
                return list(found.values()), sorted(set(self.posted) - set(found))
            time.sleep(1)


def refused_request(action: str = "check") -> CloudEvent:
    """A request the function refuses before anything runs (no ``source``: 400, the refusal
    posted as its ``<action>.failed`` reply): post → reply is the Broker twice and the
    function's validation, no container."""
    return request_event(action, {"type": "test"}, subject="main/probe", team="main")


def in_memory_broker(on: Secured, knative) -> str:
    """A Broker of the cluster's default class (the in-memory channel) beside the Kafka one,
    with the sink's Trigger: the same path, another data plane. Its URL from this machine
    (``knative``: the channel broker's ingress)."""
    cluster = on.cluster
    broker = {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "metadata": {
            "name": IN_MEMORY,
            "namespace": NAMESPACE,
            "annotations": {"eventing.knative.dev/broker.class": "MTChannelBasedBroker"},
        },
    }
    trigger = sink_trigger(on.deployment.sink.url)
    trigger["metadata"]["name"] = "test-sink-in-memory"
    trigger["spec"]["broker"] = IN_MEMORY
    cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", FIGURES_ACCOUNT, check=False)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(broker))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(trigger))
    wait_ready(cluster, NAMESPACE, [f"broker/{IN_MEMORY}", "trigger/test-sink-in-memory"])
    return knative.broker_url(NAMESPACE, IN_MEMORY)


def broker_token(on: Secured, broker: str, account: str, namespace: str) -> str:
    audience = get_json(on.cluster, "broker", broker)["status"]["address"]["audience"]
    return on.cluster.kubectl(
        "-n", namespace, "create", "token", account, "--audience", audience
    ).strip()


def figure_line(name: str, probes: Probes, seconds: float | None = None) -> str:
    spent, lost = probes.latencies()
    rate = f" in {seconds:.1f} s ({len(probes.posted) / seconds:.1f}/s)" if seconds else ""
    arrival = "reply" if probes.request else "subscriber"
    return (
        f"{name}: {len(probes.posted)} accepted{rate}, post to {arrival} p50 "
        f"{percentile(spent, 0.5) * 1000:.0f} ms, p95 {percentile(spent, 0.95) * 1000:.0f} ms; "
        f"lost {len(lost)}; delivered again {probes.repeated()}; refused posts {probes.refused}"
    )


def with_faults(probes: Probes, count: int, rate: float, faults: list[Callable[[], None]]):
    """``count`` probes at ``rate`` while ``faults`` run one after another beside them."""
    sender = threading.Thread(target=probes.run, args=(count, rate))
    sender.start()
    for fault in faults:
        time.sleep(count / rate / (len(faults) + 1))
        fault()
    sender.join()


@pytest.mark.bench
@pytest.mark.timeout(1800)
def test_figures_kafka_against_the_in_memory_channel(
    on_kafka: Secured, kafka_broker: KafkaBroker, secured: Secured, capsys
):
    count = size("RF_KAFKA_PROBES", 300, 30)
    rate = float(size("RF_KAFKA_RATE", 10, 5))
    sink = on_kafka.deployment.sink
    in_memory_url = in_memory_broker(on_kafka, secured.deployment.knative)
    kafka = Probes(sink, on_kafka.broker, on_kafka.token("pipeline-engine-main", "ci"))
    memory = Probes(
        sink, in_memory_url, broker_token(on_kafka, IN_MEMORY, FIGURES_ACCOUNT, NAMESPACE)
    )
    lines = []
    for name, probes in (("in-memory channel", memory), ("Kafka Broker", kafka)):
        started = time.monotonic()
        probes.run(count, rate)
        lines.append(figure_line(f"steady {rate:g}/s, {name}", probes, time.monotonic() - started))
    round_trips = Probes(sink, kafka.url, kafka.token, request=refused_request)
    started = time.monotonic()
    round_trips.run(count, rate)
    lines.append(
        figure_line(
            f"request to reply {rate:g}/s, Kafka Broker", round_trips, time.monotonic() - started
        )
    )
    lines += kafka_memory(kafka_broker)
    # The same pieces restarted (SIGTERM: each drains what it holds), then killed (SIGKILL,
    # as a crash or the OOM killer: nothing drained), one after another beside a steady flow.
    faulted = []
    for how, pods, kafka_node in (
        ("restarted", kafka_broker.restart_pods, kafka_broker.restart_kafka),
        ("killed", kafka_broker.crash_pods, kafka_broker.crash_kafka),
    ):
        faulty_kafka = Probes(sink, kafka.url, kafka.token)
        with_faults(
            faulty_kafka,
            count,
            rate,
            [
                lambda pods=pods: pods(SYSTEM, f"app={RECEIVER}"),
                lambda pods=pods: pods(SYSTEM, f"app={DISPATCHER}"),
                kafka_node,
            ],
        )
        lines.append(figure_line(f"Kafka Broker, receiver/dispatcher/Kafka {how}", faulty_kafka))
        faulty_memory = Probes(sink, memory.url, memory.token)
        with_faults(
            faulty_memory,
            count,
            rate,
            [lambda pods=pods, selector=s: pods(SYSTEM, selector) for s in IMC_PIECES.values()],
        )
        lines.append(figure_line(f"in-memory channel, {'/'.join(IMC_PIECES)} {how}", faulty_memory))
        faulted.append(faulty_kafka)
    with capsys.disabled():
        print("\n[kafka figures]\n" + "\n".join(lines))
    assert [p.latencies(1)[1] for p in (kafka, round_trips, *faulted)] == [[], [], [], []]


def kafka_memory(kafka: KafkaBroker) -> list[str]:
    """Kafka's (one KRaft node, JVM ``KAFKA_HEAP``) and each Kafka Broker pod's memory, as
    the figures of test_knative_figures."""
    lines = [f"memory: Kafka's JVM {' '.join(KAFKA_HEAP)}"]
    pods = []
    for namespace in (KAFKA_NAMESPACE, SYSTEM):
        listed = kafka.cluster.kubectl("-n", namespace, "get", "pods", "-o", "json")
        pods += json.loads(listed)["items"]
    for pod in pods:
        if not pod["metadata"]["name"].startswith(("kafka-", "webhook-kafka", "my-cluster")):
            continue
        for status in pod["status"].get("containerStatuses") or []:
            if status.get("containerID"):
                container = status["containerID"].split("//")[-1]
                lines.append(f"memory: {pod['metadata']['name']}: {container_memory(container)}")
    return lines
