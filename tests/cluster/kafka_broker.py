"""Knative's Apache Kafka Broker on the test cluster, from its release sources and manifests.

    install_kafka_broker(cluster, build_kafka()) -> KafkaBroker

Kafka itself (Apache Kafka 3.9.1's jars from Maven Central, ``build_kafka.sh``) runs in KRaft
mode, one node, as a pod named as Strimzi names a Kafka "my-cluster" in namespace "kafka"
(what the ``knative/kafka`` component names as shipped: its bootstrap servers, and the pods
its NetworkPolicy fences), its clients authenticated with SASL/SCRAM as production's are; a
test restarts it (``KafkaBroker.restart_kafka``) or kills it (``crash_kafka``, SIGKILL) with
its log kept, as a Kafka node restarts or crashes. The
control plane (``kafka-controller``, ``webhook-kafka``: Go, as the Knative images,
``knative.component_image``) and the data plane (the receiver and the dispatcher: Java, on a
jlink runtime, ``kafka_images.py``) are installed from the release's own ``config/`` with the
``ko://`` and ``${KNATIVE_KAFKA_*_IMAGE}`` references replaced.

Changed for the test node (two cores, already running Knative and the functions), each a
value the operators of a small cluster change too: the CPU requests (capped by ``render`` as
every release's here: the dispatcher asks for a whole core; and the probes, as every
release's: the dispatcher's 1 s exec liveness probe timed out, the receiver was restarted
before its JVM listened) and the default topic config
(``kafka-broker-config``: this Kafka, replication factor 1 on one node; the KafkaChannel's
``kafka-channel-config`` too). Left out: KafkaSource's and KafkaSink's data planes (not used
here) and the post-install storage migration (a fresh install).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from functions.cli.launch import NotReady, wait_until
from testbed.kubernetes import Cluster, ClusterError
from testbed.kubernetes.knative import apply, render, wait_deployments
from tests.cluster.node_processes import container_processes

VERSION = "1.22.3"
SYSTEM = "knative-eventing"
RECEIVER = "kafka-broker-receiver"
DISPATCHER = "kafka-broker-dispatcher"
CHANNEL_DISPATCHER = "kafka-channel-dispatcher"
INGRESS = "kafka-broker-ingress"
CONTRACT = "/etc/contract-resources/data"  # the dispatcher's mounted contract
PARTITIONS = "4"  # the default topic's; a Broker's own ConfigMap may say otherwise
KAFKA_HEAP = ("-Xms64m", "-Xmx256m")
KAFKA_START_SECONDS = 180  # about 10 on an idle machine
KAFKA_AUTH = "kafka-auth"  # the Kafka Broker's defaults' credentials, in SYSTEM
# The release's config folders installed here (control plane: CRDs, controller, webhook; data
# plane: the receivers and dispatchers of the Broker and of the KafkaChannel).
CONTROL_PLANE = "control-plane/eventing-kafka-broker"
DATA_PLANES = ("data-plane/broker", "data-plane/channel")  # the Broker's, the KafkaChannel's
LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


# Kafka as a pod named as Strimzi names a Kafka "my-cluster" in namespace "kafka": what the
# kafka component's ConfigMap (bootstrap servers) and NetworkPolicy (pods) name as shipped.
KAFKA_NAMESPACE = "kafka"
KAFKA_LABELS = {
    "strimzi.io/cluster": "my-cluster",
    "strimzi.io/kind": "Kafka",
    "strimzi.io/name": "my-cluster-kafka",
}
KAFKA_SELECTOR = "strimzi.io/name=my-cluster-kafka"
BOOTSTRAP = "my-cluster-kafka-bootstrap"  # its Service
PORT = 9092  # clients: SASL_PLAINTEXT with SCRAM-SHA-512 only
KAFKA_USER = "knative-kafka"  # the one SCRAM user: the Kafka Broker's control and data planes
SCRAM = "SCRAM-SHA-512"
START = """\
set -euf
java_="java -XX:+UseSerialGC {heap} -Dlog4j.configuration=file:/config/log4j.properties -cp /app/libs/*"
if [ ! -f /data/meta.properties ]; then
  $java_ kafka.tools.StorageTool format --cluster-id "$(cat /auth/cluster-id)" \\
    --config /config/server.properties \\
    --add-scram "{scram}=[name=$(cat /auth/user),password=$(cat /auth/password)]"
fi
exec $java_ kafka.Kafka /config/server.properties
"""


@dataclass
class KafkaServer:
    """One KRaft node (broker and controller) as a pod of the test cluster, as a Kafka of
    production runs: clients reach it through its Service, authenticated with SASL/SCRAM
    (``credentials``); the broker's own and the controller's listeners are on the pod's
    loopback. Its log dir is a directory of this machine (``data``, a hostPath): a pod
    deleted or killed comes back with every record. A test restarts it or kills it as
    any pod (``KafkaBroker.restart_kafka``, ``crash_kafka``)."""

    cluster: Cluster
    image: str
    data: Path
    password: str = field(default_factory=lambda: os.urandom(16).hex(), repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{BOOTSTRAP}.{KAFKA_NAMESPACE}:{PORT}"

    def credentials(self, namespace: str, name: str) -> dict:
        """The Secret with which Knative's Kafka Broker authenticates (its keys)."""
        data = {"protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM}
        data |= {"user": KAFKA_USER, "password": self.password}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": data,
        }

    def start(self, timeout: float = KAFKA_START_SECONDS) -> None:
        """Apply the pod's objects and wait until it is Ready (its client port open)."""
        self.data.mkdir(parents=True, exist_ok=True)
        apply(self.cluster, self.manifests())
        self.cluster.kubectl(
            "-n",
            KAFKA_NAMESPACE,
            "rollout",
            "status",
            "statefulset/my-cluster-kafka",
            f"--timeout={int(timeout)}s",
        )

    def manifests(self) -> list[dict]:
        meta = {"namespace": KAFKA_NAMESPACE, "labels": KAFKA_LABELS}
        auth = {"user": KAFKA_USER, "password": self.password, "cluster-id": _cluster_id()}
        config = {
            "server.properties": self._server_properties(),
            "log4j.properties": LOG4J,
            "start.sh": START.format(heap=" ".join(KAFKA_HEAP), scram=SCRAM),
        }
        container = {
            "name": "kafka",
            "image": self.image,
            "command": ["/bin/sh", "/config/start.sh"],
            "ports": [{"name": "clients", "containerPort": PORT}],
            "readinessProbe": {
                "tcpSocket": {"port": PORT},
                "periodSeconds": 2,
                "timeoutSeconds": 5,
            },
            "resources": {"requests": {"cpu": "100m", "memory": "384Mi"}},
            "securityContext": {"runAsUser": 0},
            "volumeMounts": [
                {"name": "config", "mountPath": "/config"},
                {"name": "auth", "mountPath": "/auth"},
                {"name": "data", "mountPath": "/data"},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }
        volumes = [
            {"name": "config", "configMap": {"name": "my-cluster-kafka-config"}},
            {"name": "auth", "secret": {"secretName": "my-cluster-kafka-scram"}},
            {"name": "data", "hostPath": {"path": str(self.data), "type": "DirectoryOrCreate"}},
            {"name": "tmp", "emptyDir": {}},
        ]
        return [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KAFKA_NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "my-cluster-kafka-config", **meta},
                "data": config,
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "my-cluster-kafka-scram", **meta},
                "stringData": auth,
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": BOOTSTRAP, **meta},
                "spec": {
                    "selector": KAFKA_LABELS,
                    "ports": [{"name": "clients", "port": PORT, "targetPort": PORT}],
                },
            },
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "my-cluster-kafka", **meta},
                "spec": {
                    "serviceName": BOOTSTRAP,
                    "replicas": 1,
                    "selector": {"matchLabels": KAFKA_LABELS},
                    "template": {
                        "metadata": {"labels": KAFKA_LABELS},
                        "spec": {
                            "automountServiceAccountToken": False,
                            "terminationGracePeriodSeconds": 60,
                            "containers": [container],
                            "volumes": volumes,
                        },
                    },
                },
            },
        ]

    def _server_properties(self) -> str:
        advertised = f"{BOOTSTRAP}.{KAFKA_NAMESPACE}.svc.cluster.local:{PORT}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": "1@127.0.0.1:9093",
            "listeners": f"SASL_PLAINTEXT://0.0.0.0:{PORT},INTERNAL://127.0.0.1:9091,"
            "CONTROLLER://127.0.0.1:9093",
            "advertised.listeners": f"SASL_PLAINTEXT://{advertised},INTERNAL://127.0.0.1:9091",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM,
            f"listener.name.sasl_plaintext.{SCRAM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "log.dirs": "/data",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "5",  # 50 by default: files and start-up time
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "auto.create.topics.enable": "false",  # as in production: the Broker makes its topics
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())


def _cluster_id() -> str:
    """A random cluster id as ``kafka-storage random-uuid`` prints it (16 random bytes in 22
    characters of URL-safe base64, never a leading ``-``, which would read as an option)."""
    while True:
        value = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value


@dataclass
class KafkaBroker:
    cluster: Cluster
    kafka: KafkaServer
    ingress: str  # http://<cluster IP> of kafka-broker-ingress, reachable from this machine

    def broker_url(self, namespace: str, broker: str = "default") -> str:
        return f"{self.ingress}/{namespace}/{broker}"

    def restart_kafka(self) -> None:
        """Kafka's pod deleted (SIGTERM: a controlled shutdown) and back, its records kept."""
        self.restart_pods(KAFKA_NAMESPACE, KAFKA_SELECTOR)

    def crash_kafka(self) -> None:
        """Kafka killed (SIGKILL: what it acknowledged is in the page cache) and started again
        by the kubelet, on the same log dir."""
        self.crash_pods(KAFKA_NAMESPACE, KAFKA_SELECTOR)

    def dispatcher_accounts(self, namespace: str, app: str = DISPATCHER) -> dict[str, str]:
        """Egress (a Trigger's, or a KafkaChannel's Subscription's) name -> the OIDC service
        account it names ("" when none), in the contract each pod of the dispatcher ``app``
        has mounted (JSON: the release's contract format)."""
        listing = ("-n", SYSTEM, "get", "pods", "-l", f"app={app}", "-o", "name")
        accounts: dict[str, str] = {}
        for pod in self.cluster.kubectl(*listing).split():
            text = self.cluster.kubectl(
                "-n", SYSTEM, "exec", pod, "--", "cat", CONTRACT, check=False
            )
            try:
                contract = json.loads(text or "{}")
            except json.JSONDecodeError:
                continue  # being rewritten
            for resource in contract.get("resources", []):
                for egress in resource.get("egresses", []):
                    reference = egress.get("reference", {})
                    if reference.get("namespace") == namespace:
                        accounts[reference["name"]] = egress.get("oidcServiceAccountName", "")
        return accounts

    def restart_pods(
        self, namespace: str, selector: str, wait: bool = True, timeout: int = 300
    ) -> None:
        """Delete the pods of ``selector`` and (``wait``) wait until their replacements are
        Ready (new pods by uid: a StatefulSet's keeps its name); a Knative Service's pods
        come back on demand, so those are not waited for.

        Their dependents are orphaned, not deleted: a dispatcher pod owns its contract
        ConfigMap (named after the pod), and the control plane makes it again for the new pod
        of the same name only if it sees it missing when that pod appears. The garbage
        collector deleting it just after left the new pod in ContainerCreating ("configmap
        kafka-broker-dispatcher-0 not found") for good (a fresh run, 2026-12-05)."""
        listing = ("-n", namespace, "get", "pods", "-l", selector, "-o", "json")
        before = {p["metadata"]["uid"] for p in json.loads(self.cluster.kubectl(*listing))["items"]}
        self.cluster.kubectl(
            "-n", namespace, "delete", "pods", "-l", selector, "--cascade=orphan", "--wait=false"
        )
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while True:
            pods = json.loads(self.cluster.kubectl(*listing, check=False) or '{"items": []}')
            rows = [
                (
                    p["metadata"]["uid"] in before,
                    all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}]),
                )
                for p in pods["items"]
            ]
            if rows and all(not old and ready for old, ready in rows):
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"pods {selector} in {namespace} not back after {timeout} s: {rows}\n"
                    + self.pods_state(namespace, selector)
                )
            time.sleep(1)

    def crash_pods(self, namespace: str, selector: str, timeout: int = 300) -> None:
        """SIGKILL every process of the containers of the pods of ``selector``, as a crash
        or the OOM killer does (no SIGTERM, nothing drained), and wait until the kubelet has
        started each container again and the pods are Ready (the same pods: restartCount)."""
        listing = ("-n", namespace, "get", "pods", "-l", selector, "-o", "json")
        restarts = container_restarts(json.loads(self.cluster.kubectl(*listing))["items"])
        killed = [kill_container(ident) for ident in restarts]
        assert all(killed), f"no process found for some containers of {selector}: {restarts}"
        before = dict(restarts.values())

        def back() -> bool:
            pods = json.loads(self.cluster.kubectl(*listing, check=False) or '{"items": []}')
            now = {
                (p["metadata"]["uid"], s["name"]): (s.get("restartCount", 0), s.get("ready"))
                for p in pods["items"]
                for s in p["status"].get("containerStatuses") or []
            }
            return all(now.get(key, (0, False))[0] > n and now[key][1] for key, n in before.items())

        try:
            wait_until(back, f"pods {selector} in {namespace} started again", timeout, interval=1)
        except NotReady as error:
            raise ClusterError(f"{error}\n{self.pods_state(namespace, selector)}") from error

    def pods_state(self, namespace: str, selector: str) -> str:
        """Why pods are not Ready: each one's state, last state, restarts and events
        (``describe``), and the log of a container's previous run (a probe or a crash)."""
        described = self.cluster.kubectl(
            "-n", namespace, "describe", "pods", "-l", selector, check=False
        )
        previous = self.cluster.kubectl(
            "-n",
            namespace,
            "logs",
            "-l",
            selector,
            "--previous",
            "--tail=30",
            "--prefix",
            "--all-containers",
            check=False,
        )
        return f"{described}\n--- previous logs ---\n{previous}"


def container_restarts(pods: list[dict]) -> dict[str, tuple[tuple[str, str], int]]:
    """containerd's id of each running container of ``pods`` -> ((pod uid, container name),
    its restartCount)."""
    return {
        s["containerID"].split("//")[-1]: (
            (p["metadata"]["uid"], s["name"]),
            s.get("restartCount", 0),
        )
        for p in pods
        for s in p["status"].get("containerStatuses") or []
        if s.get("containerID") and "running" in (s.get("state") or {})
    }


def kill_container(ident: str) -> bool:
    """SIGKILL every process of the container; whether there was one."""
    found = False
    for proc, _ in container_processes(ident):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.kill(int(proc.name), signal.SIGKILL)
        found = True
    return found


def install_kafka_broker(cluster: Cluster, builds: dict[str, Path]) -> KafkaBroker:
    from tests.cluster.kafka_images import control_plane_images, data_plane_images, kafka_image

    started = time.monotonic()
    home = builds["kafka-broker"]
    images = {**control_plane_images(home), **data_plane_images(home)}
    kafka = KafkaServer(cluster, kafka_image(builds["kafka"] / "libs"), cluster.root / "kafka")
    cluster.import_images(tuple(sorted({*images.values(), kafka.image})))
    kafka.start()
    # The Kafka Broker's own defaults (a Broker without a config, the KafkaChannel) reach this
    # Kafka with its credentials, as the functions' Broker does with the component's.
    apply(cluster, [kafka.credentials(SYSTEM, KAFKA_AUTH)])
    auth = {"auth.secret.ref.name": KAFKA_AUTH}
    settings = {
        (SYSTEM, "kafka-broker-config"): {
            "bootstrap.servers": kafka.bootstrap,
            "default.topic.partitions": PARTITIONS,
            "default.topic.replication.factor": "1",
            **auth,
        },
        (SYSTEM, "kafka-channel-config"): {
            "bootstrap.servers": kafka.bootstrap,
            **auth,
            "auth.secret.ref.namespace": SYSTEM,
        },
    }
    control = render(home / "config" / CONTROL_PLANE, images, settings=settings)
    crds = [d for d in control if d["kind"] == "CustomResourceDefinition"]
    apply(cluster, crds)
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    apply(cluster, [d for d in control if d["kind"] != "CustomResourceDefinition"])
    data = [doc for plane in DATA_PLANES for doc in render(home / "config" / plane, images)]
    apply(cluster, data)
    wait_deployments(cluster, SYSTEM)
    ip = cluster.kubectl(
        "-n", SYSTEM, "get", "service", INGRESS, "-o", "jsonpath={.spec.clusterIP}"
    ).strip()
    cluster.note(f"kafka broker installed in {time.monotonic() - started:.1f}s")
    return KafkaBroker(cluster, kafka, f"http://{ip}")
