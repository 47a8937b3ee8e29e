"""Knative Eventing and Serving on the test cluster, installed from their own release manifests.

    install_knative(cluster, build_knative()) -> Knative

Images: each component's static binary (``build_knative.sh``, from the vendored release
sources) in a ``buildah from scratch`` image with the CA bundle, run as user 65532, imported
into the cluster's containerd; every ``ko://knative.dev/<repo>/cmd/<path>`` reference of the
manifests is replaced by the local image. Installed: Eventing core, the in-memory channel, the
MT channel-based broker (PingSource and SinkBinding are part of core); Serving core.

Test-cluster settings, each a plain ConfigMap value of the release manifests:
``config-network`` names the test KIngress class, ``config-defaults`` raises
``max-revision-timeout-seconds`` as the project README tells operators to, and
``config-autoscaler`` scales idle revisions to zero within seconds so that a test can see a
cold start. Left out: the job-sink and request-reply workloads (not used, and their images
are not built), and the HorizontalPodAutoscalers (there is no metrics API).

Serving resolves image tags to digests through a registry, except for the registries of
``config-deployment`` ``registries-skipping-tag-resolving`` (``dev.local`` by default): the
project image is tagged ``dev.local/…`` in containerd for the Knative Services (``dev_local``).

The networking layer is ``kingress`` (``testbed/kubernetes/kingress/``), the one non-production hop:
it runs on this machine, and a selector-less Service ``kingress`` in ``knative-serving`` (an
EndpointSlice to the gateway) is the load balancer that Routes' placeholder Services name.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from functions.cli.launch import free_port
from testbed.kubernetes.cluster import Cluster
from testbed.kubernetes.containerd_images import run
from testbed.kubernetes.layout import CLUSTER_DOMAIN, GATEWAY
from testbed.kubernetes.processes import ClusterError

EVENTING_VERSION = "1.22.2"
SERVING_VERSION = "1.22.1"
INGRESS_CLASS = "kingress.test.resource-functions.dev"
LB_SERVICE = "kingress"
LB_NAMESPACE = "knative-serving"
IMAGE_USER = "65532:65532"
# Workloads of the release whose images are not built here (features not used).
LEFT_OUT = {("knative-eventing", "job-sink"), ("knative-eventing", "request-reply")}
SETTINGS = {
    ("knative-serving", "config-network"): {"ingress-class": INGRESS_CLASS},
    ("knative-serving", "config-defaults"): {"max-revision-timeout-seconds": "3600"},
    ("knative-serving", "config-autoscaler"): {
        "stable-window": "6s",
        "scale-to-zero-grace-period": "6s",
    },
}


@dataclass
class Knative:
    cluster: Cluster
    broker_ingress: str  # http://<cluster IP> of broker-ingress, reachable from this machine
    kingress_port: int = 0  # the test KIngress on the gateway

    def broker_url(self, namespace: str, broker: str = "default") -> str:
        return f"{self.broker_ingress}/{namespace}/{broker}"


def component_image(binary: Path, repo: str, version: str, project: str = "knative") -> str:
    """``localhost/<project>-<repo>-<name>:<version>``, built once per machine: the binary at
    ``/ko-app/<name>`` (where ko puts it, and where Tekton's pod specs run it), the CA bundle,
    user 65532."""
    ref = f"localhost/{project}-{repo}-{binary.name.replace('_', '-')}:{version}"
    if subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        return ref
    container = run(["buildah", "from", "scratch"])
    try:
        run(
            ["buildah", "copy", "--chmod", "0755", container, str(binary), f"/ko-app/{binary.name}"]
        )
        run(
            [
                "buildah",
                "copy",
                container,
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/ssl/certs/ca-certificates.crt",
            ]
        )
        run(
            [
                "buildah",
                "config",
                "--entrypoint",
                json.dumps([f"/ko-app/{binary.name}"]),
                "--cmd",
                "",
                "--user",
                IMAGE_USER,
                "--env",
                "KO_DATA_PATH=/var/run/ko",
                container,
            ]
        )
        run(["buildah", "commit", "--quiet", container, ref])
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def component_images(
    tools: dict[str, Path],
    releases: tuple[tuple[str, str], ...] = (
        ("eventing", EVENTING_VERSION),
        ("serving", SERVING_VERSION),
    ),
    module: str = "knative.dev/{repo}",
    project: str = "knative",
) -> dict[str, str]:
    """``ko://`` reference -> local image, for every binary built: each ``ko://<module>/cmd/…``
    of a release's ``config/`` (``tools[repo]``: its binaries, ``config/`` beside them)."""
    images = {}
    for repo, version in releases:
        config = tools[repo].parent / "config"
        pattern = re.compile(re.escape("ko://" + module.format(repo=repo) + "/cmd/") + r"[\w./-]+")
        refs = {ref for path in config.rglob("*.yaml") for ref in pattern.findall(path.read_text())}
        for ref in sorted(refs):
            binary = tools[repo] / ref.rsplit("/", 1)[1]
            if binary.is_file():
                images[ref] = component_image(binary, repo, version, project)
    return images


def render(
    folder: Path,
    images: dict[str, str],
    left_out: set[tuple[str, str]] = LEFT_OUT,
    settings: dict[tuple[str, str], dict[str, str]] = SETTINGS,
    skip: tuple[str, ...] = (),
) -> list[dict]:
    """The documents of every YAML file under ``folder`` but its subfolders named in ``skip``,
    with images replaced, the ``left_out`` Deployments (namespace, name) and the
    HorizontalPodAutoscalers dropped, the ``settings`` ConfigMap values applied, the CPU
    requests capped (``cap_cpu_requests``) and the probes fitted to the loaded node
    (``fit_probes_to_the_test_node``)."""
    docs = []
    for path in sorted(folder.rglob("*.yaml")):
        if set(path.relative_to(folder).parts[:-1]) & set(skip):
            continue
        text = path.read_text()
        for ko, local in sorted(images.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(ko, local)
        for doc in yaml.safe_load_all(text):
            if not doc or "kind" not in doc:
                continue
            meta = doc.get("metadata", {})
            key = (meta.get("namespace"), meta.get("name"))
            if doc["kind"] in ("Deployment", "StatefulSet") and key in left_out:
                continue
            if doc["kind"] == "HorizontalPodAutoscaler":  # no metrics API here: one replica
                continue
            if doc["kind"] == "ConfigMap" and key in settings:
                doc.setdefault("data", {}).update(settings[key])
            if doc["kind"] in ("Deployment", "StatefulSet"):
                cap_cpu_requests(doc)
                fit_probes_to_the_test_node(doc)
            docs.append(doc)
    return docs


# The releases' CPU requests (Knative's activator alone asks 300m) add up to most of the test
# node's two cores, and with Tekton's and the Kafka Broker's the functions' own pods would
# not be scheduled. A request only reserves; every limit stays as released.
CPU_REQUEST_CAP_MILLICORES = 25


def millicores(quantity: str) -> float:
    """A Kubernetes CPU quantity ("300m", "1", "0.5") in millicores."""
    text = str(quantity)
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def cap_cpu_requests(workload: dict, cap: int = CPU_REQUEST_CAP_MILLICORES) -> None:
    """Lower each container's CPU request of ``workload`` (a Deployment or StatefulSet) to at
    most ``cap`` millicores, in place."""
    for container in workload["spec"]["template"]["spec"].get("containers", []):
        requests = (container.get("resources") or {}).get("requests") or {}
        if "cpu" in requests and millicores(requests["cpu"]) > cap:
            requests["cpu"] = f"{cap}m"


# The releases' probes suit a node with room; the test node has two loaded cores. There an
# exec probe alone (runc starting ``ls``) took over the releases' 1 s (kubelet: "timed out
# after 1s", the Kafka Broker dispatcher's liveness probe), and a JVM took over the 19 s that
# a liveness probe's delay and three failures give to start listening (the Kafka Broker
# receiver, restarted): either restarts a healthy container, again and again into
# CrashLoopBackOff. So each probe gets PROBE_TIMEOUT_SECONDS to answer, and a container with
# a liveness probe gets STARTUP_SECONDS to start (a startup probe of the same check: liveness
# waits for it). Periods and thresholds stay: a started container that stops answering is
# found as soon as released.
PROBE_TIMEOUT_SECONDS = 5
STARTUP_SECONDS = 120
STARTUP_PERIOD_SECONDS = 2
HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")


def fit_probes_to_the_test_node(
    workload: dict, timeout: int = PROBE_TIMEOUT_SECONDS, startup: int = STARTUP_SECONDS
) -> None:
    """Raise each probe's timeout of ``workload`` (a Deployment or StatefulSet) to at least
    ``timeout`` and give each container with a liveness probe but no startup probe one that
    checks the same for ``startup`` seconds, in place."""
    for container in workload["spec"]["template"]["spec"].get("containers", []):
        liveness = container.get("livenessProbe")
        if liveness is not None and "startupProbe" not in container:
            container["startupProbe"] = {
                **{k: v for k, v in liveness.items() if k in HANDLERS},
                "periodSeconds": STARTUP_PERIOD_SECONDS,
                "failureThreshold": startup // STARTUP_PERIOD_SECONDS,
            }
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = container.get(kind)
            if probe is not None and probe.get("timeoutSeconds", 1) < timeout:
                probe["timeoutSeconds"] = timeout


def min_scale(cluster: Cluster, namespace: str, service: str, value: str | None) -> None:
    """Set (or, with None, remove) a Knative Service's min-scale annotation: a new revision."""
    annotations = {"autoscaling.knative.dev/min-scale": value}
    patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
    cluster.kubectl(
        "-n", namespace, "patch", "ksvc", service, "--type=merge", "-p", json.dumps(patch)
    )


def apply(cluster: Cluster, docs: list[dict], attempts: int = 30) -> None:
    """``kubectl apply`` of a list, retried while webhooks are not serving yet."""
    payload = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    for attempt in range(attempts):
        done = cluster.run_kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=payload
        )
        if done.returncode == 0:
            return
        if attempt == attempts - 1:
            raise ClusterError(f"kubectl apply failed: {done.stderr.strip()[-3000:]}")
        time.sleep(2)


def wait_deployments(cluster: Cluster, namespace: str, timeout: float = 300) -> None:
    done = cluster.run_kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Available",
        "deployment",
        "--all",
        f"--timeout={int(timeout)}s",
    )
    if done.returncode != 0:
        pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False)
        raise ClusterError(
            f"Deployments in {namespace} not Available: {done.stderr.strip()}\n"
            f"{pods}\n{cluster.diagnostics(15)}"
        )


def install_knative(cluster: Cluster, tools: dict[str, Path]) -> Knative:
    started = time.monotonic()
    images = component_images(tools)
    cluster.import_images(tuple(sorted(set(images.values()))))
    eventing = tools["eventing"].parent / "config"
    serving = tools["serving"].parent / "config"
    apply(cluster, render(eventing / "core", images))
    apply(cluster, render(eventing / "channels" / "in-memory-channel", images))
    apply(cluster, render(eventing / "brokers" / "mt-channel-broker", images))
    # Serving: CRDs first (its Certificate and Image objects need them), then the rest.
    core = serving / "core"
    crds = [d for d in render(core, images) if d["kind"] == "CustomResourceDefinition"]
    apply(cluster, crds)
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    apply(cluster, [d for d in render(core, images) if d["kind"] != "CustomResourceDefinition"])
    kingress_port = start_kingress(cluster, tools["kingress"])
    wait_deployments(cluster, "knative-eventing")
    wait_deployments(cluster, "knative-serving")
    ip = cluster.kubectl(
        "-n",
        "knative-eventing",
        "get",
        "service",
        "broker-ingress",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ).strip()
    cluster.note(f"knative installed in {time.monotonic() - started:.1f}s")
    return Knative(cluster, f"http://{ip}", kingress_port)


def start_kingress(cluster: Cluster, bin_dir: Path) -> int:
    """The KIngress proxy on the gateway, and the Service that makes it the load balancer;
    its port."""
    port = free_port(GATEWAY)
    admin = json.loads(cluster.admin_kubeconfig.read_text())["users"][0]["user"]
    cluster.spawn(
        "kingress",
        [
            str(bin_dir / "kingress"),
            "--server",
            cluster.server,
            "--ca",
            str(cluster.ca.cert),
            "--cert",
            admin["client-certificate"],
            "--key",
            admin["client-key"],
            "--listen",
            f"{GATEWAY}:{port}",
            "--dns",
            f"{GATEWAY}:53",
            "--class",
            INGRESS_CLASS,
            "--lb-host",
            f"{LB_SERVICE}.{LB_NAMESPACE}.svc.{CLUSTER_DOMAIN}",
        ],
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": LB_SERVICE, "namespace": LB_NAMESPACE},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": port, "protocol": "TCP"}]},
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{LB_SERVICE}-gateway",
            "namespace": LB_NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": LB_SERVICE,
                "endpointslice.kubernetes.io/managed-by": "rf-tests",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }
    apply(cluster, [service, endpoints])
    return port


def dev_local(cluster: Cluster, image: str) -> str:
    """``image`` (imported into containerd) tagged ``dev.local/<name>:<tag>`` as well, a
    registry whose tags Serving does not try to resolve (there is no registry here)."""
    name = "dev.local/" + image.split("/", 1)[1]
    cluster.ctr("images", "tag", "--force", image, name)
    return name
