"""Fixtures of the end-to-end tests on a real single-node Kubernetes (``tests/cluster/up.py``).

Session-wide, in this order: the project image and the test resource image (built with Podman,
imported into the cluster's containerd), the cluster itself, an S3 server (moto) bound to the
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
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.cluster.up import GATEWAY, Cluster, free_port, new_cluster

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "resource-functions"  # knative/namespace.yaml, knative/rbac.yaml
STORE_SECRET = "resource-functions-store"
FUNCTIONS_ACCOUNT = "resource-functions"
CORE_KINDS = {"Namespace", "ServiceAccount", "Role", "RoleBinding"}
TASK_MARGIN_SECONDS = 30  # stage + collect budget on top of a type's timeout
SLOW_TIMEOUT_SECONDS = 5
MOTO_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def cluster_images() -> dict[str, str]:
    """The project image (stage/collect steps) and the test resource image."""
    from tests.images import build_test_resource
    from tests.project_image import build_project_image

    return {"task": build_project_image(), "resource": build_test_resource()}


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@pytest.fixture(scope="session")
def cluster(cluster_images: dict[str, str]) -> Iterator[Cluster]:
    """The cluster, torn down at the end of the session, also when the run is stopped with
    SIGTERM (pytest then tears fixtures down as on Ctrl-C). A run killed outright leaves a
    stale cluster that the next ``new_cluster`` (or ``python -m tests.cluster.up --cleanup``)
    tears down."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    instance = new_cluster(keep=bool(os.environ.get("RF_CLUSTER_KEEP")))
    try:
        instance.start(tuple(cluster_images.values()))
        yield instance
    finally:
        instance.stop()
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class GatewayS3:
    endpoint: str
    bucket: str
    client: object


@pytest.fixture(scope="session")
def gateway_s3(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayS3]:
    """moto on the bridge's host-side address only: reachable from this machine and from the
    pods on the bridge, from nowhere else."""
    import boto3
    from botocore.config import Config

    port = free_port(GATEWAY)
    endpoint = f"http://{GATEWAY}:{port}"
    log = tmp_path_factory.mktemp("gateway-moto") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", GATEWAY, "-p",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(endpoint + "/", timeout=1)
                break
            except requests.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto on {endpoint} did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
        client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(s3={"addressing_style": "path"}))
        bucket = f"rf-cluster-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=bucket)
        yield GatewayS3(endpoint, bucket, client)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    manifests = {"apiVersion": "v1", "kind": "List", "items": core_manifests()}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifests))
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": STORE_SECRET, "namespace": NAMESPACE},
        "stringData": {**MOTO_KEYS, "AWS_ENDPOINT_URL_S3": gateway_s3.endpoint,
                       "AWS_EC2_METADATA_DISABLED": "true"},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    # The ServiceAccount admission needs the task pods' account to exist before any Job.
    deadline = time.monotonic() + 30
    while not cluster.kubectl("-n", NAMESPACE, "get", "serviceaccount", "resource-task",
                              "-o", "name", check=False):
        if time.monotonic() > deadline:
            pytest.fail("ServiceAccount resource-task did not appear")
        time.sleep(0.2)
    return NAMESPACE


@pytest.fixture(scope="session")
def functions_kubeconfig(cluster: Cluster, namespace: str,
                         tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig with a token of the functions' ServiceAccount (not an admin)."""
    path = tmp_path_factory.mktemp("functions-kubeconfig") / "kubeconfig"
    return cluster.token_kubeconfig(path, namespace, FUNCTIONS_ACCOUNT)


def resource_types(image: str) -> str:
    return json.dumps({
        "test": image,
        "slow": {"image": image, "timeout_seconds": SLOW_TIMEOUT_SECONDS},
        "missing": "localhost/rf-no-such-image:1",
    })


@dataclass
class ClusterDeployment:
    cluster: Cluster
    services: object  # tests.e2e.conftest.Services
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
        out = self.cluster.kubectl("-n", self.namespace, "get", "job", name, "-o", "json",
                                   check=False)
        job = json.loads(out) if out else None
        return job if job is not None and condition(job) else None

    def pods(self, job: str) -> list[dict]:
        return json.loads(self.cluster.kubectl("-n", self.namespace, "get", "pods", "-o", "json",
                                               "-l", f"job-name={job}"))["items"]


@pytest.fixture(scope="module")  # module: its environment must not outlive the cluster tests
def deployment(cluster: Cluster, cluster_images: dict[str, str], gateway_s3: GatewayS3,
               namespace: str, functions_kubeconfig: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterDeployment]:
    """check/get/put services on this machine, running their tasks as Jobs in the cluster."""
    from storage import open_store
    from tests.e2e.conftest import start_services

    tmp = tmp_path_factory.mktemp("cluster-deployment")
    env = {
        "RUNTIME": "kubernetes", "KUBECONFIG": str(functions_kubeconfig),
        "TASK_NAMESPACE": namespace, "TASK_IMAGE": cluster_images["task"],
        "TASK_STORE_SECRET": STORE_SECRET, "TASK_MARGIN_SECONDS": str(TASK_MARGIN_SECONDS),
        "STORE_URL": f"s3://{gateway_s3.bucket}/cluster-{uuid.uuid4().hex[:8]}",
        "RESOURCE_TYPES": resource_types(cluster_images["resource"]),
        "CACHE_SECRET": "cluster-e2e-cache-secret", "LOG_LEVEL": "debug", "WORK_DIR": str(tmp),
        "AWS_ENDPOINT_URL_S3": gateway_s3.endpoint, **MOTO_KEYS,
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    unset = ("AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
             "DOCKER_HOST", "K_SINK")
    with pytest.MonkeyPatch.context() as patch:
        for name in unset:
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        store = open_store(env["STORE_URL"])
        services = start_services(env, tmp / "services.log")
        try:
            yield ClusterDeployment(cluster, services, store, gateway_s3, namespace,
                                    functions_kubeconfig)
        finally:
            services.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing cluster test reports the tail of every component's log."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "cluster" in item.fixturenames:
        instance = item.funcargs.get("cluster")
        if instance is not None:
            report.sections.append(("cluster logs", instance.diagnostics(25)))
