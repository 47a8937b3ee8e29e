"""Tekton Pipelines and Triggers on the test cluster, installed from their own release manifests.

    install_tekton(cluster, build_tekton()) -> Tekton

Images: as for Knative (``knative.component_image``): each binary of ``build_tekton.sh`` in a
``buildah from scratch`` image at ``/ko-app/<name>`` (Tekton's task pods run
``/ko-app/entrypoint``, ``/ko-app/workingdirinit`` and ``/ko-app/sidecarlogresults`` at those
fixed paths), with the CA bundle, user 65532 (the manifests' ``runAsNonRoot``), tagged with the
release version, never ``latest`` (Tekton sets no pull policy on the containers it injects, so a
``latest`` tag would be pulled). Every ``ko://github.com/tektoncd/<repo>/cmd/<name>`` of the
manifests is replaced by the local image: the controllers' and webhooks' own images, the
Pipelines controller's ``-entrypoint-image``, ``-nop-image``, ``-sidecarlogresults-image`` and
``-workingdirinit-image``, and the Triggers controller's ``-el-image`` (the EventListener pods'
``eventlistenersink``). ``-shell-image`` and ``-shell-image-win`` (registry images by digest in
the release) are set to a local busybox image, ``Tekton.shell_image``, which steps may use too.

Installed, both in the namespace ``tekton-pipelines``: Pipelines' ``config/`` without
``resolvers/`` (no remote ``taskRef`` here) and without the events controller (it only sends
runs' CloudEvents to a ``config-events`` sink), whose binaries are not built; all of Triggers'
``config/``, core interceptors included: an EventListener exits at start (and crash-loops) until
some https ClusterInterceptor has a caBundle, which the core interceptors' server writes, even
when none of its triggers uses an interceptor. The webhook's HPA is dropped (no metrics API).
No ConfigMap is changed.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from functions.cli.busybox_image import build_resource_image
from testbed.kubernetes import Cluster, ClusterError, build_tools
from testbed.kubernetes.knative import apply, component_images, render, wait_deployments

PIPELINE_VERSION = "1.15.0"
TRIGGERS_VERSION = "0.37.0"
NAMESPACE = "tekton-pipelines"
LEFT_OUT = {(NAMESPACE, "tekton-events-controller")}
CONTROLLER = "tekton-pipelines-controller"


@dataclass
class Tekton:
    cluster: Cluster
    shell_image: str  # busybox (sh, printf, cat, …), imported into the cluster


def build_tekton() -> dict[str, Path]:
    """Directories of the Tekton binaries and manifests (``pipeline``, ``triggers``), built on
    first use (minutes)."""
    return build_tools(Path(__file__).with_name("build_tekton.sh"))


def shell_image() -> str:
    """``localhost/tekton-shell:<tag>``: busybox and its applets in ``/bin``, built once."""
    with tempfile.TemporaryDirectory() as empty:
        return build_resource_image("localhost/tekton-shell", Path(empty))


def set_args(docs: list[dict], deployment: str, values: dict[str, str]) -> None:
    """Set the value that follows each flag of ``values`` in the args of ``deployment``'s
    containers; a flag that is not there is an error (the release changed)."""
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == deployment:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                args = container.get("args", [])
                for flag, value in values.items():
                    args[args.index(flag) + 1] = value
            return
    raise ValueError(f"no Deployment {deployment}")


def install_tekton(cluster: Cluster, tools: dict[str, Path]) -> Tekton:
    """Pipelines, then Triggers (they share Pipelines' namespace); returns once every
    Deployment of ``tekton-pipelines`` is Available and EventListeners can start (the https
    ClusterInterceptors have their caBundle)."""
    started = time.monotonic()
    images = component_images(
        tools,
        (("pipeline", PIPELINE_VERSION), ("triggers", TRIGGERS_VERSION)),
        module="github.com/tektoncd/{repo}",
        project="tekton",
    )
    shell = shell_image()
    cluster.import_images(tuple(sorted({*images.values(), shell})))
    pipeline = render(
        tools["pipeline"].parent / "config", images, LEFT_OUT, {}, skip=("resolvers",)
    )
    set_args(pipeline, CONTROLLER, {"-shell-image": shell, "-shell-image-win": shell})
    triggers = render(tools["triggers"].parent / "config", images, set(), {})
    if "ko://" in json.dumps(pipeline + triggers):
        raise ClusterError("a ko:// image of the Tekton manifests has no binary built")
    for docs in (pipeline, triggers):
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        apply(cluster, crds)
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        # Retried by apply while the release's own webhooks (which validate its ConfigMaps)
        # are not serving yet.
        apply(cluster, [d for d in docs if d["kind"] != "CustomResourceDefinition"], 90)
    wait_deployments(cluster, NAMESPACE)
    wait_ca_bundles(cluster)
    cluster.note(f"tekton installed in {time.monotonic() - started:.1f}s")
    return Tekton(cluster, shell)


def wait_ca_bundles(cluster: Cluster, timeout: float = 120) -> None:
    """Until every ClusterInterceptor labelled ``server/type: https`` (there is at least one)
    has the caBundle that an EventListener needs to start."""
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.kubectl("get", "clusterinterceptors", "-l", "server/type=https", "-o", "json")
        items = json.loads(got)["items"]
        pending = [
            i["metadata"]["name"] for i in items if not i["spec"]["clientConfig"].get("caBundle")
        ]
        if items and not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"ClusterInterceptors without a caBundle: {pending or 'none listed'}"
            )
        time.sleep(1)


def tekton_diagnostics(cluster: Cluster, namespaces: tuple[str, ...], lines: int = 30) -> str:
    """The pods of ``namespaces`` and the tail of each one's logs (of the last crash too)."""
    parts = []
    for namespace in (NAMESPACE, *namespaces):
        got = cluster.kubectl("-n", namespace, "get", "pods", "-o", "json", check=False)
        pods = json.loads(got)["items"] if got else []
        parts.append(cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False))
        for pod in pods:
            name = pod["metadata"]["name"]
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            crashed = any(s.get("restartCount") for s in statuses)
            for previous in [False, True] if crashed else [False]:
                args = ["-n", namespace, "logs", name, "--all-containers", f"--tail={lines}"]
                shown = cluster.kubectl(*args, *(["--previous"] if previous else []), check=False)
                parts.append(f"--- logs {namespace}/{name}{' (previous)' * previous} ---\n{shown}")
    return "\n".join(parts)
