"""Fixtures of the end-to-end tests on a real single-node Kubernetes (``testbed/kubernetes``).

Session-wide, in this order: the project image and the test resource image (built with Podman,
imported into the cluster's containerd), the cluster itself, an S3 server (versitygw) bound to the
CNI bridge's host-side address only (the pods' only way out, and an address of this machine),
the namespace, ServiceAccounts, Role and RoleBinding of ``knative/`` applied as they ship, the
store credentials Secret the task pods read, and the three services (``python -m functions
serve``) running on this machine with a kubeconfig holding a token of the ``resource-functions``
ServiceAccount: the functions act with exactly the rights of the shipped Role.

Set ``RF_CLUSTER_KEEP=1`` to keep the cluster directory (component logs) after the session.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testbed import event_sink as sinks
from testbed.event_sink import EventSink
from testbed.kubernetes import GATEWAY, Cluster, new_cluster
from testbed.kubernetes.network_policies import NetworkPolicyEnforcement, enforce_network_policies
from tests.cluster.counter import Counter

KNATIVE_CACHE_SECRET = "knative-e2e-cache-secret"

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "resource-functions"  # knative/namespace.yaml, knative/rbac.yaml
TASKS_NAMESPACE = "resource-functions-tasks"  # the task Jobs' own (TASK_NAMESPACE)
STORE_SECRET = "resource-functions-store"
FUNCTIONS_ACCOUNT = "resource-functions"
CORE_KINDS = {"Namespace", "ServiceAccount", "Role", "RoleBinding"}
TASK_MARGIN_SECONDS = 30  # stage + collect budget on top of a type's timeout
SLOW_TIMEOUT_SECONDS = 5


@pytest.fixture(scope="session")
def cluster_images() -> dict[str, str]:
    """The project image (stage/collect steps), the test resource image and the warm
    resource image (a check that counts its runs in $TMPDIR: test_warm_pods.py)."""
    from tests.support.images import build_test_resource, build_warm_resource
    from tests.support.project_image import build_project_image

    return {
        "task": build_project_image(),
        "resource": build_test_resource(),
        "warm": build_warm_resource(),
    }


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@pytest.fixture(scope="session")
def cluster(cluster_images: dict[str, str]) -> Iterator[Cluster]:
    """The cluster, torn down at the end of the session, also when the run is stopped with
    SIGTERM (pytest then tears fixtures down as on Ctrl-C). A run killed outright leaves a
    stale cluster that the next ``new_cluster`` (or ``python -m testbed.kubernetes --cleanup``)
    tears down."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    instance = new_cluster(keep=bool(os.environ.get("RF_CLUSTER_KEEP")))
    try:
        instance.start(tuple(cluster_images.values()))
        yield instance
    finally:
        instance.stop()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def real_resource_images(
    cluster: Cluster, registry_image_resource: str, git_resource: str
) -> dict[str, str]:
    """Concourse's registry-image and git resources (the catalogue's ``registry-image`` and
    ``git``), imported into the cluster's containerd."""
    images = {"registry-image": registry_image_resource, "git": git_resource}
    cluster.import_images(tuple(images.values()))
    return images


@pytest.fixture(scope="module")  # module: enforcement must not outlive the tests that asked
def network_policies(cluster: Cluster) -> Iterator[NetworkPolicyEnforcement]:
    """NetworkPolicies enforced on the cluster (kube-network-policies, ``network_policies.py``)
    for the tests of one module; off again after them."""
    enforcement = enforce_network_policies(cluster)
    try:
        yield enforcement
    finally:
        enforcement.stop()


@dataclass(frozen=True)
class GatewayS3:
    endpoint: str
    bucket: str
    client: object
    keys: dict[str, str]  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION

    @property
    def env(self) -> dict[str, str]:
        """What a process (or a task pod, through a Secret) needs to reach this server."""
        return {**self.keys, "AWS_ENDPOINT_URL_S3": self.endpoint}


@pytest.fixture(scope="session")
def gateway_s3(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayS3]:
    """versitygw (a real S3 server) on the bridge's host-side address only: reachable from
    this machine and from the pods on the bridge, from nowhere else."""
    from testbed.versitygw import start_versitygw

    root = tmp_path_factory.mktemp("gateway-s3")
    with start_versitygw(GATEWAY, root=root / "buckets", log=root / "server.log") as s3:
        client = s3.client()
        bucket = f"rf-cluster-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=bucket)
        keys = {
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_DEFAULT_REGION": s3.region,
        }
        yield GatewayS3(s3.endpoint, bucket, client, keys)


def core_manifests() -> list[dict]:
    """The parts of knative/ that a cluster without Knative accepts, as they ship."""
    docs = []
    for name in ("namespace.yaml", "rbac.yaml"):
        for doc in yaml.safe_load_all((REPO / "knative" / name).read_text()):
            if doc and doc.get("kind") in CORE_KINDS:
                docs.append(doc)
    return docs


@pytest.fixture(scope="session")
def namespace(cluster: Cluster, gateway_s3: GatewayS3) -> str:
    """The task namespace, with the shipped namespaces, accounts and Role applied and the
    tasks' store Secret in it."""
    manifests = {"apiVersion": "v1", "kind": "List", "items": core_manifests()}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifests))
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": STORE_SECRET, "namespace": TASKS_NAMESPACE},
        "stringData": {**gateway_s3.env, "AWS_EC2_METADATA_DISABLED": "true"},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    # The ServiceAccount admission needs the task pods' account to exist before any Job.
    deadline = time.monotonic() + 30
    while not cluster.kubectl(
        "-n", TASKS_NAMESPACE, "get", "serviceaccount", "resource-task", "-o", "name", check=False
    ):
        if time.monotonic() > deadline:
            pytest.fail("ServiceAccount resource-task did not appear")
        time.sleep(0.2)
    return TASKS_NAMESPACE


@pytest.fixture(scope="session")
def functions_kubeconfig(
    cluster: Cluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig with a token of the functions' ServiceAccount (not an admin)."""
    path = tmp_path_factory.mktemp("functions-kubeconfig") / "kubeconfig"
    return cluster.token_kubeconfig(path, NAMESPACE, FUNCTIONS_ACCOUNT)


@pytest.fixture(scope="session")
def gateway_registry(cluster: Cluster) -> Iterator[str]:
    """A registry on the gateway that is down, busy or refusing on demand
    (``testbed/registry_stub.py``), which the kubelet may pull from over plain HTTP."""
    from testbed.registry_stub import registry_stub

    with registry_stub(GATEWAY) as address:
        cluster.allow_plain_http_registry(address)
        yield address


def resource_types(image: str, registry: str = "") -> str:
    """The test catalogue; ``registry``: the gateway's stub, for images that cannot be had."""
    from tests.support.real_resources import git_resource_ref, registry_image_resource_ref

    types: dict[str, object] = {
        "test": image,
        "slow": {"image": image, "timeout_seconds": SLOW_TIMEOUT_SECONDS},
        "missing": f"{registry}/nope:1" if registry else "localhost/rf-no-such-image:1",
    }
    if registry:
        types["registry-down"] = f"{registry}/down:1"
    # Concourse's real resources, named by the references they will have: built and imported
    # only by the tests that run them (the ``real_resource_images`` fixture). One catalogue
    # for every module, since function pods read it at start and may outlive a module.
    types["registry-image"] = registry_image_resource_ref()
    types["git"] = git_resource_ref()
    return json.dumps(types)


@dataclass
class ClusterDeployment:
    cluster: Cluster
    services: object  # tests.support.services.Services
    store: object
    s3: GatewayS3
    namespace: str
    kubeconfig: Path

    def jobs(self, **labels: str) -> list[dict]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        args = ["-n", self.namespace, "get", "jobs", "-o", "json"]
        if selector:
            args += ["-l", selector]
        return json.loads(self.cluster.kubectl(*args))["items"]

    def job_if(self, name: str, condition) -> dict | None:
        """The Job ``name`` if ``condition(job)`` holds, else None."""
        out = self.cluster.kubectl(
            "-n", self.namespace, "get", "job", name, "-o", "json", check=False
        )
        job = json.loads(out) if out else None
        return job if job is not None and condition(job) else None

    def pods(self, job: str) -> list[dict]:
        return json.loads(
            self.cluster.kubectl(
                "-n", self.namespace, "get", "pods", "-o", "json", "-l", f"job-name={job}"
            )
        )["items"]


@pytest.fixture(scope="module")
def services_in_cluster(
    cluster: Cluster,
    cluster_images: dict[str, str],
    gateway_s3: GatewayS3,
    namespace: str,
    functions_kubeconfig: Path,
) -> Callable[..., AbstractContextManager[ClusterDeployment]]:
    """``cluster_services`` on this session's cluster, task image, store and namespace:
    called with the catalogue, a work directory and any extra environment."""

    def services(
        types: str, tmp: Path, extra: dict[str, str] | None = None
    ) -> AbstractContextManager[ClusterDeployment]:
        return cluster_services(
            cluster,
            cluster_images["task"],
            types,
            gateway_s3,
            namespace,
            functions_kubeconfig,
            tmp,
            extra=extra,
        )

    return services


@pytest.fixture(scope="module")  # module: its environment must not outlive the cluster tests
def deployment(
    services_in_cluster: Callable[..., AbstractContextManager[ClusterDeployment]],
    cluster_images: dict[str, str],
    gateway_registry: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterDeployment]:
    """check/get/put services on this machine, running their tasks as Jobs in the cluster."""
    types = resource_types(cluster_images["resource"], gateway_registry)
    with services_in_cluster(types, tmp_path_factory.mktemp("cluster-deployment")) as deployed:
        yield deployed


@contextmanager
def cluster_services(
    cluster: Cluster,
    task_image: str,
    types: str,
    gateway_s3: GatewayS3,
    namespace: str,
    kubeconfig: Path,
    tmp: Path,
    extra: dict[str, str] | None = None,
) -> Iterator[ClusterDeployment]:
    """The three services with ``RESOURCE_TYPES=types``, their tasks Jobs in the cluster
    (checks too: ``WARM_CHECKS=off`` unless ``extra`` says otherwise); their environment
    (with ``extra``) is set for the block only."""
    from storage import open_store
    from tests.support.secret_forms import HOSTILE
    from tests.support.services import start_services

    (tmp / "credentials" / "shared").mkdir(parents=True)  # ((hostile)): the dir provider
    (tmp / "credentials" / "shared" / "hostile").write_text(HOSTILE + "\n")
    env = {
        "RUNTIME": "kubernetes",
        "KUBECONFIG": str(kubeconfig),
        "TASK_NAMESPACE": namespace,
        "TASK_IMAGE": task_image,
        "TASK_STORE_SECRET": STORE_SECRET,
        "TASK_MARGIN_SECONDS": str(TASK_MARGIN_SECONDS),
        "STORE_URL": f"s3://{gateway_s3.bucket}/cluster-{uuid.uuid4().hex[:8]}",
        "RESOURCE_TYPES": types,
        "CACHE_SECRET": "cluster-e2e-cache-secret",
        "LOG_LEVEL": "debug",
        "WORK_DIR": str(tmp),
        "CREDENTIALS_DIR": str(tmp / "credentials"),
        **gateway_s3.env,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "WARM_CHECKS": "off",
        **(extra or {}),
    }
    unset = (
        "AWS_REGION",
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "DOCKER_HOST",
        "K_SINK",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name in unset:
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        store = open_store(env["STORE_URL"])
        services = start_services(env, tmp / "services.log")
        try:
            yield ClusterDeployment(cluster, services, store, gateway_s3, namespace, kubeconfig)
        finally:
            services.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing cluster test (or its setup) reports the tail of every component's log."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("setup", "call") and report.failed and "cluster" in item.fixturenames:
        instance = item.funcargs.get("cluster")
        if instance is not None:
            if {"knative_deployment", "sender_auth", "on_kafka"} & set(item.fixturenames):
                report.sections.append(("knative", knative_diagnostics(instance, NAMESPACE)))
            if "tekton" in item.fixturenames:
                from tests.cluster.tekton import tekton_diagnostics

                namespaces = getattr(item.module, "TEKTON_NAMESPACES", ())
                report.sections.append(("tekton", tekton_diagnostics(instance, namespaces)))
            report.sections.append(("cluster logs", instance.diagnostics(25)))


def knative_diagnostics(cluster: Cluster, namespace: str, lines: int = 30) -> str:
    """What a failing production-path test needs first: the functions' objects and the tail
    of their logs and of the Broker's."""
    parts = [
        cluster.kubectl("-n", namespace, "get", "ksvc,revision,job,pod", "-o", "wide", check=False),
        # the runs' Jobs: whether a request that got no reply ever started one
        cluster.kubectl("-n", TASKS_NAMESPACE, "get", "job,pod", "-o", "wide", check=False),
    ]
    for selector, ns, container in [
        ("serving.knative.dev/service=check", namespace, "function"),
        ("serving.knative.dev/service=get", namespace, "function"),
        ("serving.knative.dev/service=put", namespace, "function"),
        ("serving.knative.dev/service=dead-letter", namespace, "function"),
        ("eventing.knative.dev/brokerRole=filter", "knative-eventing", ""),
        ("eventing.knative.dev/brokerRole=ingress", "knative-eventing", ""),
        ("messaging.knative.dev/role=dispatcher", "knative-eventing", ""),
        ("app=kafka-broker-receiver", "knative-eventing", ""),
        ("app=kafka-broker-dispatcher", "knative-eventing", ""),
        ("strimzi.io/name=my-cluster-kafka", "kafka", ""),
        ("app.kubernetes.io/component=reply-relay", namespace, ""),
        ("resource-functions.dev/run-id", TASKS_NAMESPACE, ""),
    ]:
        args = ["-n", ns, "logs", "-l", selector, f"--tail={lines}", "--prefix"]
        which = ["-c", container] if container else ["--all-containers"]
        shown = cluster.kubectl(*args, *which, check=False)
        parts.append(f"--- logs {ns} {selector} ---\n{shown}")
    return "\n".join(parts)


# --- the production path: Knative Eventing and Serving --------------------------------------


@pytest.fixture(scope="session")
def knative(cluster: Cluster):
    """Knative Eventing and Serving installed from their release manifests (minutes the first
    time on a machine: component images are built once and kept by Podman)."""
    from testbed.kubernetes import build_knative
    from testbed.kubernetes.knative import install_knative

    return install_knative(cluster, build_knative())


@pytest.fixture(scope="session")
def event_sink(cluster: Cluster) -> Iterator[EventSink]:
    """A CloudEvents sink on the gateway, the end of every reply's way through the Broker."""
    with sinks.event_sink(GATEWAY) as sink:
        yield sink


@pytest.fixture(scope="session")
def knative_store_prefix() -> str:
    """The functions' store prefix, one per session: each module applies the same
    configuration, so function pods that outlive a module serve the next one alike."""
    return f"knative-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def knative_deployment(
    cluster: Cluster,
    knative,
    cluster_images: dict[str, str],
    gateway_s3: GatewayS3,
    event_sink: EventSink,
    network_policies,
    knative_store_prefix: str,
    task_egress: list[dict],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KnativeDeployment]:
    """``knative/`` applied as users apply it (``kubectl apply -k``, image and config
    overrides only, and the task pods' egress to this cluster's DNS and test servers on the
    gateway, and ``task_egress``), plus a Trigger that sends every event of the Broker to the
    sink; with its NetworkPolicies enforced."""
    overlay = deployment_overlay(
        tmp_path_factory.mktemp("knative-deployment"),
        cluster,
        knative,
        cluster_images,
        gateway_s3,
        knative_store_prefix,
        task_egress,
    )
    cluster.kubectl("apply", "-k", str(overlay))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(sink_trigger(event_sink.url)))
    wait_ready(
        cluster,
        NAMESPACE,
        [
            "ksvc/check",
            "ksvc/get",
            "ksvc/put",
            "ksvc/dead-letter",
            "broker/default",
            "trigger --all",
            "sinkbinding --all",
        ],
    )
    cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/reply-relay", "--timeout=300s"
    )
    wait_functions_serve(cluster, NAMESPACE)
    from storage import open_store

    with pytest.MonkeyPatch.context() as patch:
        for name, value in gateway_s3.env.items():
            patch.setenv(name, value)
        store = open_store(f"s3://{gateway_s3.bucket}/{knative_store_prefix}")
        yield KnativeDeployment(
            cluster,
            knative,
            event_sink,
            store,
            NAMESPACE,
            gateway_s3,
            overlay,
        )


@pytest.fixture(scope="module")
def counted() -> Iterator[Counter]:
    """Three versions for the test resource's checks, served on the gateway; each check that
    names one of its ``url_for``s is counted there (``reads``): its script's runs."""
    served = Counter(3)
    yield served
    served.close()


@pytest.fixture(scope="module")
def task_egress() -> list[dict]:
    """Egress rules a module adds to the task pods' policy (``knative/network-policies.yaml``),
    as a user adds one for a registry or git server on a private address. The gateway ports
    they name are left out of the harness's own gateway rule, so these rules alone admit
    them. A module overrides this fixture; by default none."""
    return []


def ports_of(rules: list[dict]) -> tuple[int, ...]:
    return tuple(port["port"] for rule in rules for port in rule.get("ports", []))


def deployment_overlay(
    tmp: Path,
    cluster: Cluster,
    knative,
    images: dict[str, str],
    s3: GatewayS3,
    prefix: str,
    task_egress: list[dict],
) -> Path:
    """``knative/`` as the cluster tests apply it (``write_overlay``): the project image, the
    test catalogue, the store under ``prefix``, and the task pods' egress to this cluster's
    DNS and test servers on the gateway, but for the ports ``task_egress`` opens itself."""
    from testbed.kubernetes.knative import dev_local

    closed = (cluster.api_port, cluster.kubelet_port, knative.kingress_port, *ports_of(task_egress))
    return write_overlay(
        tmp,
        image=dev_local(cluster, images["task"]),
        config={
            "STORE_URL": f"s3://{s3.bucket}/{prefix}",
            "RESOURCE_TYPES": resource_types(images["resource"]),
            "LOG_LEVEL": "debug",
        },
        store_env=s3.env,
        cache_secret=KNATIVE_CACHE_SECRET,
        task_egress=[gateway_egress(cluster, closed=closed), *task_egress],
    )


def sink_trigger(url: str) -> dict:
    """A Trigger without a filter: every event the Broker takes reaches the sink at ``url``."""
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": "test-sink", "namespace": NAMESPACE},
        "spec": {
            "broker": "default",
            "subscriber": {"uri": url},
            # The sink is ours: no retries to hide a failure.
            "delivery": {"retry": 0, "timeout": "PT10S"},
        },
    }


def gateway_egress(cluster: Cluster, closed: tuple[int, ...]) -> dict:
    """The task pods' egress rule for this cluster: here DNS, the S3 server and the tests'
    other servers listen on the gateway, a private address the shipped policy keeps task pods
    from (as a real cluster's DNS pods and in-cluster store would need their own rule). Every
    gateway port but ``closed`` (the API server, the kubelet, the KIngress: what the shipped
    policy must keep task pods from) is opened."""
    ports: list[dict] = [{"protocol": "UDP", "port": 53}]
    start = 1
    for port in sorted(p for p in closed if p):
        if start < port:
            ports.append({"protocol": "TCP", "port": start, "endPort": port - 1})
        start = port + 1
    ports.append({"protocol": "TCP", "port": start, "endPort": 65535})
    return {"to": [{"ipBlock": {"cidr": f"{GATEWAY}/32"}}], "ports": ports}


def write_overlay(
    tmp: Path,
    *,
    image: str,
    config: dict[str, str],
    store_env: dict[str, str],
    cache_secret: str,
    task_egress: list[dict] | None = None,
) -> Path:
    """A copy of knative/ with its image set (as ``kustomize edit set image`` does), and an
    overlay that sets configuration values and the two Secrets."""
    import shutil

    base = tmp / "knative"
    shutil.copytree(REPO / "knative", base)
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    name, _, tag = image.rpartition(":")
    kustomization["images"] = [{"name": "resource-functions", "newName": name, "newTag": tag}]
    (base / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    overlay = tmp / "overlay"
    overlay.mkdir()
    (overlay / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "resource-functions-config", "namespace": NAMESPACE},
                "data": config,
            }
        )
    )
    (overlay / "secrets.yaml").write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {"name": STORE_SECRET, "namespace": NAMESPACE},
                    "stringData": store_env,
                },
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {"name": STORE_SECRET, "namespace": TASKS_NAMESPACE},
                    "stringData": store_env,
                },
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {"name": "resource-functions-cache", "namespace": NAMESPACE},
                    "stringData": {"CACHE_SECRET": cache_secret},
                },
            ]
        )
    )
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../knative", "secrets.yaml"],
                "patches": [{"path": "config.yaml"}]
                + (
                    [
                        {
                            "target": {"kind": "NetworkPolicy", "name": "task-pods"},
                            "patch": json.dumps(
                                [
                                    {"op": "add", "path": "/spec/egress/-", "value": rule}
                                    for rule in task_egress
                                ]
                            ),
                        }
                    ]
                    if task_egress
                    else []
                ),
            }
        )
    )
    return overlay


def wait_ready(cluster: Cluster, namespace: str, objects: list[str], timeout: int = 300) -> None:
    """Until each of ``objects`` (``kind/name``, or ``kind --all``) has the condition Ready
    True, read by polling: a full run once saw ``kubectl wait`` time out on Triggers whose
    status had said Ready for minutes (a watch event it never got)."""
    for target in objects:
        args, deadline = target.replace("--all", "").split(), time.monotonic() + timeout
        while True:
            got = cluster.run_kubectl("-n", namespace, "get", *args, "-o", "json")
            listed = json.loads(got.stdout) if got.returncode == 0 else {}
            items = listed.get("items", []) if "items" in listed else [listed] if listed else []
            pending = [i["metadata"]["name"] for i in items if not _ready(i)] or (
                [got.stderr.strip()] if got.returncode else []
            )
            if items and not pending:
                break
            if time.monotonic() > deadline:
                why = {
                    i["metadata"]["name"]: (i.get("status") or {}).get("conditions")
                    for i in items
                    if not _ready(i)
                }
                pytest.fail(
                    f"{target} not Ready after {timeout}s: {pending or 'none listed'}; "
                    f"their conditions: {json.dumps(why, indent=1)[-6000:]}"
                )
            time.sleep(1)


def _ready(item: dict) -> bool:
    conditions = (item.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_functions_serve(
    cluster: Cluster, namespace: str, timeout: float = 300, sink: bool = True, sink_value: str = ""
) -> None:
    """Until every function serves its latest revision, Ready and all its traffic on it, with
    K_SINK in its environment (``sink``, holding ``sink_value``; without it when false). The
    SinkBinding injects K_SINK after the Services first become Ready, which rolls out a second
    revision; the tests exercise the shipped REPLY_MODE=async, so they wait for it."""
    deadline = time.monotonic() + timeout
    while True:
        listed = json.loads(
            cluster.kubectl(
                "-n",
                namespace,
                "get",
                "ksvc",
                "-l",
                "resource-functions.dev/role=function",
                "-o",
                "json",
            )
        )["items"]
        pending = [k["metadata"]["name"] for k in listed if not _serves(k, sink, sink_value)]
        if len(listed) == 3 and not pending:
            return
        if time.monotonic() > deadline:
            wanted = "with" if sink else "without"
            pytest.fail(
                f"functions without a Ready revision {wanted} K_SINK after {timeout}s: {pending}"
            )
        time.sleep(1)


def _serves(ksvc: dict, sink: bool, sink_value: str = "") -> bool:
    status = ksvc.get("status", {})
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    env = ksvc["spec"]["template"]["spec"]["containers"][0].get("env", [])
    latest = status.get("latestReadyRevisionName")
    # Ready alone can be a Route still on the previous revision: all traffic on the latest.
    routed = [t for t in status.get("traffic", []) if t.get("percent")]
    return (
        ready
        and status.get("observedGeneration") == ksvc["metadata"]["generation"]
        and latest == status.get("latestCreatedRevisionName")
        and bool(routed)
        and all(t.get("revisionName") == latest for t in routed)
        and any(e.get("name") == "K_SINK" and sink_value in e.get("value", "") for e in env) == sink
    )


@dataclass
class KnativeDeployment:
    cluster: Cluster
    knative: object  # testbed.kubernetes.knative.Knative
    sink: EventSink
    store: object
    namespace: str
    s3: GatewayS3
    overlay: Path  # what was applied with kubectl apply -k
    tasks_namespace: str = TASKS_NAMESPACE

    @property
    def broker(self) -> str:
        return self.knative.broker_url(self.namespace)

    def jobs(self, **labels: str) -> list[dict]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        args = ["-n", self.tasks_namespace, "get", "jobs", "-o", "json"]
        if selector:
            args += ["-l", selector]
        return json.loads(self.cluster.kubectl(*args))["items"]


# --- the production path as a multi-team cluster runs it ------------------------------------


@pytest.fixture(scope="session")
def secured(
    cluster: Cluster,
    knative,
    tekton,
    cluster_images: dict[str, str],
    gateway_s3: GatewayS3,
    event_sink: EventSink,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[object]:
    """``authentication-oidc`` on, ``knative/`` with the sender-auth and tekton components,
    NetworkPolicies enforced, Tekton installed (``tests/cluster/secured.py``), once a session:
    the modules that ask for it run after all the others (``pytest_collection_modifyitems``)."""
    from storage import open_store
    from tests.cluster.custom_task import wait_sink_injected
    from tests.cluster.secured import secure

    enforcement = enforce_network_policies(cluster)
    patch = pytest.MonkeyPatch()
    try:
        for name, value in gateway_s3.env.items():
            patch.setenv(name, value)
        made = secure(
            cluster,
            knative,
            cluster_images,
            gateway_s3,
            event_sink,
            tmp_path_factory.mktemp("secured"),
            open_store,
        )
        wait_sink_injected(cluster)
        yield made
    finally:
        patch.undo()
        enforcement.stop()


# A module's stage: the latest piece it needs, in the order .ci/cluster builds them. The
# modules run by stage, so that the cluster tier can start once Kubernetes and Knative are
# built while the later pieces build (a fixture that needs one waits for its build's lock);
# the ``secured`` ones after the others, since ``authentication-oidc`` stays on after them,
# and last the Kafka Broker's, which move the secured deployment's Broker to class Kafka.
STAGES = (
    ("kafka_broker", 5),
    ("secured", 4),
    ("tekton", 3),
    ("network_policies", 2),
    ("knative", 1),
)


def stage(item: pytest.Item) -> int:
    names = set(getattr(item, "fixturenames", ()))
    return next((n for fixture, n in STAGES if fixture in names), 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules by stage (``STAGES``), each module whole, in their own order otherwise."""
    stages: dict[object, int] = {}
    for item in items:
        stages[item.module] = max(stages.get(item.module, 0), stage(item))
    items.sort(key=lambda item: stages[item.module])


# --- a pipeline engine: Tekton Pipelines and Triggers ---------------------------------------


@pytest.fixture(scope="session")
def tekton(cluster: Cluster):
    """Tekton Pipelines and Triggers installed from their release manifests
    (``tests/cluster/tekton.py``), only in sessions with a test that asks for them; kept for
    the session (the component images take a minute or two the first time on a machine)."""
    from tests.cluster.tekton import build_tekton, install_tekton

    return install_tekton(cluster, build_tekton())


# --- durable delivery: Knative's Kafka Broker -----------------------------------------------


@pytest.fixture(scope="session")
def kafka_broker(cluster: Cluster, knative):
    """Kafka (one KRaft node, a pod, SASL/SCRAM) and Knative's Kafka Broker installed from its
    release manifests (``tests/cluster/kafka_broker.py``), only in sessions with a test that
    asks for it (its modules run last: they move the Broker to class Kafka)."""
    from tests.cluster.kafka_broker import install_kafka_broker
    from tests.cluster.kafka_images import build_kafka

    return install_kafka_broker(cluster, build_kafka())
