"""What a pod of a given namespace can reach, asked from a pod there (the NetworkPolicy
enforcer judges a pod's traffic by its namespace and labels).

    reachable_from(cluster, namespace, image, urls) -> ({url: answered}, what it said)
    connects_from(cluster, namespace, image, addresses) -> ({"host:port": connected}, said)
    run_pod(cluster, namespace, image, command) -> its log, once it ended

Each target is tried three times, 5 s each: the enforcer may not know a pod this new for a
moment, and a shut address stays shut however often asked. ``image`` has Python (the
project's).
"""

from __future__ import annotations

import json
import time
import uuid

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply

HTTP = """
import json, sys, time, urllib.error, urllib.request
found = {}
for url in sys.argv[1:]:
    said = ""
    for _ in range(3):
        try:
            urllib.request.urlopen(url, timeout=5).close()
            said = "open"
        except urllib.error.HTTPError:
            said = "open"
        except Exception as err:
            said = repr(err)
            time.sleep(2)
            continue
        break
    found[url] = said
print(json.dumps(found))
"""
TCP = """
import json, socket, sys, time
found = {}
for address in sys.argv[1:]:
    host, port = address.rsplit(":", 1)
    said = ""
    for _ in range(3):
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            said = "open"
            break
        except Exception as err:
            said = repr(err)
            time.sleep(2)
    found[address] = said
print(json.dumps(found))
"""


def reachable_from(
    cluster: Cluster, namespace: str, image: str, urls: list[str]
) -> tuple[dict[str, bool], str]:
    """Whether a pod of ``namespace`` gets an HTTP answer, any status, from each of ``urls``
    (a timeout, a refused connection or a name that does not resolve: no)."""
    return _asked(cluster, namespace, image, HTTP, urls)


def connects_from(
    cluster: Cluster, namespace: str, image: str, addresses: list[str]
) -> tuple[dict[str, bool], str]:
    """Whether a pod of ``namespace`` opens a TCP connection to each ``host:port``."""
    return _asked(cluster, namespace, image, TCP, addresses)


def _asked(
    cluster: Cluster, namespace: str, image: str, script: str, targets: list[str]
) -> tuple[dict[str, bool], str]:
    said = run_pod(cluster, namespace, image, ["python", "-c", script, *targets])
    answers = json.loads(said.strip().splitlines()[-1])
    return {target: answers.get(target) == "open" for target in targets}, said


def run_pod(
    cluster: Cluster,
    namespace: str,
    image: str,
    command: list[str],
    volumes: list[dict] | None = None,
    mounts: list[dict] | None = None,
    timeout: float = 120,
    token: bool = False,
) -> str:
    """Run ``command`` in a pod of ``namespace`` until it ends; its log. ``token``: with the
    namespace's default ServiceAccount token mounted."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    container: dict = {
        "name": "probe",
        "image": image,
        "command": command,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": token,
            "containers": [container],
            "volumes": volumes or [],
        },
    }
    apply(cluster, [pod])
    deadline = time.monotonic() + timeout
    while cluster.kubectl(
        "-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.phase}", check=False
    ) not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"probe pod {name} did not finish"
        time.sleep(0.5)
    said = cluster.kubectl("-n", namespace, "logs", name)
    cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
    return said
