"""The harness's NetworkPolicy enforcement (``network_policies.py``), tested on its own: with it
on, a policy decides what pods reach by pod IP, by ClusterIP and on the node IP (the apiserver,
directly and as the ``kubernetes`` Service); this machine's root processes are never filtered;
turned off, everything flows again and none of its rules or processes is left.

The probes are busybox (the test resource image): ``nc -e true`` connects and exits at once,
and a dropped SYN times out after 2 s. Every "blocked" is preceded by the same probe open."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from functions.cli.launch import wait_until
from testbed.kubernetes import GATEWAY, SERVICE_IP, Cluster
from testbed.kubernetes.network_policies import CHAINS, NAME, QUEUE, queue_bound

# The enforcer sees a new policy through its informers: a little after it is applied.
POLICY_SEEN = "the policy enforced"

SERVER_PORT = 8080
SERVE = "mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
ROLES = ("server", "allowed", "other", "egress")  # one namespace each


@dataclass
class Probes:
    cluster: Cluster
    namespaces: dict[str, str]  # role -> namespace
    server_ip: str
    service_ip: str  # the ClusterIP of the server's Service (port 80)

    def reaches(self, role: str, host: str, port: int) -> bool:
        return self._run(role, f"nc -w 2 {host} {port} -e true")

    def resolves(self, role: str) -> bool:
        return self._run(role, "nslookup kubernetes.default.svc.cluster.local")

    def _run(self, role: str, probe: str) -> bool:
        script = f"if {probe} >/dev/null 2>&1; then echo OPEN; else echo BLOCKED; fi"
        done = self.cluster.run_kubectl(
            "-n", self.namespaces[role], "exec", "client", "--", "sh", "-c", script
        )
        verdict = done.stdout.strip()
        assert verdict in ("OPEN", "BLOCKED"), f"{probe} in {role}: {done.stderr.strip()}"
        return verdict == "OPEN"

    def apply(self, role: str, *policies: dict) -> None:
        items = [
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                **p,
                "metadata": {**p["metadata"], "namespace": self.namespaces[role]},
            }
            for p in policies
        ]
        apply_list(self.cluster, items)


def pod(namespace: str, name: str, image: str, script: str, **extra: object) -> dict:
    container = {"name": name, "image": image, "command": ["sh", "-c", script], **extra}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
        },
    }


@pytest.fixture(scope="module")
def probes(cluster: Cluster, cluster_images: dict[str, str], network_policies) -> Iterator[Probes]:
    """A server pod (httpd, a kubelet readiness probe every second) with a Service, and a client
    pod in each of the other namespaces."""
    suffix = uuid.uuid4().hex[:6]
    namespaces = {role: f"np-{role}-{suffix}" for role in ROLES}
    image = cluster_images["resource"]
    readiness = {"tcpSocket": {"port": SERVER_PORT}, "periodSeconds": 1, "failureThreshold": 1}
    apply_list(
        cluster,
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in namespaces.values()
        ],
    )
    try:
        # Pods are admitted once their namespace's default ServiceAccount exists.
        for ns in namespaces.values():
            wait_until(
                lambda ns=ns: cluster.kubectl(
                    "-n", ns, "get", "serviceaccount", "default", check=False
                ),
                f"the default ServiceAccount of {ns}",
                interval=0.5,
            )
        server = namespaces["server"]
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "server", "namespace": server},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        clients = [pod(namespaces[role], "client", image, "exec sleep 3600") for role in ROLES[1:]]
        apply_list(
            cluster,
            [pod(server, "server", image, SERVE, readinessProbe=readiness), service, *clients],
        )
        for ns in namespaces.values():
            cluster.kubectl(
                "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=90s"
            )
        yield Probes(
            cluster,
            namespaces,
            cluster.kubectl("-n", server, "get", "pod", "server", "-o", "jsonpath={.status.podIP}"),
            cluster.kubectl(
                "-n", server, "get", "svc", "server", "-o", "jsonpath={.spec.clusterIP}"
            ),
        )
    finally:
        cluster.kubectl("delete", "namespace", *namespaces.values(), "--wait=false", check=False)


def apply_list(cluster: Cluster, items: list[dict]) -> None:
    cluster.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def from_namespace(namespace: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}


def host_reaches_as(uid: int, host: str, port: int) -> bool:
    argv = ["busybox", "nc", "-w", "2", host, str(port), "-e", "true"]
    if uid:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def test_an_ingress_policy_admits_only_the_namespace_it_allows(probes, network_policies):
    ip, svc = probes.server_ip, probes.service_ip
    assert probes.reaches("other", ip, SERVER_PORT) and probes.reaches("other", svc, 80)
    assert host_reaches_as(65534, ip, SERVER_PORT)

    # The allow first: once "other" is blocked, the enforcer has it.
    allow = {
        "podSelector": {},
        "ingress": [{"from": [from_namespace(probes.namespaces["allowed"])]}],
    }
    probes.apply(
        "server",
        {"metadata": {"name": "allow-from-allowed"}, "spec": {**allow, "policyTypes": ["Ingress"]}},
        {
            "metadata": {"name": "default-deny"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
        },
    )

    wait_until(lambda: not probes.reaches("other", ip, SERVER_PORT), POLICY_SEEN, interval=0.5)
    assert not probes.reaches("other", svc, 80)
    assert probes.reaches("allowed", ip, SERVER_PORT)
    assert probes.reaches("allowed", svc, 80)
    # This machine: root is never filtered (kubelet probes), any other user is.
    with socket.create_connection((ip, SERVER_PORT), timeout=3):
        pass
    assert not host_reaches_as(65534, ip, SERVER_PORT)
    ready = probes.cluster.kubectl(
        "-n",
        probes.namespaces["server"],
        "get",
        "pod",
        "server",
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    )
    assert ready == "True"
    network_policies.assert_enforcing()


def test_an_egress_policy_allowing_only_dns_blocks_the_apiserver(probes, network_policies):
    api_port = probes.cluster.api_port
    assert probes.resolves("egress")
    assert probes.reaches("egress", GATEWAY, api_port)
    assert probes.reaches("egress", SERVICE_IP, 443)

    dns = [{"protocol": proto, "port": 53} for proto in ("UDP", "TCP")]
    to_node = [{"ipBlock": {"cidr": f"{GATEWAY}/32"}}]
    probes.apply(
        "egress",
        {
            "metadata": {"name": "dns-only"},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Egress"],
                "egress": [{"to": to_node, "ports": dns}],
            },
        },
    )

    wait_until(lambda: not probes.reaches("egress", GATEWAY, api_port), POLICY_SEEN, interval=0.5)
    assert not probes.reaches("egress", SERVICE_IP, 443)  # judged after DNAT: the same node port
    assert probes.resolves("egress")
    assert probes.reaches("other", GATEWAY, api_port)  # no policy selects it
    network_policies.assert_enforcing()


def test_turned_off_everything_flows_and_nothing_is_left(probes, network_policies):
    """Last in this module: it turns the module's enforcement off."""
    cluster = probes.cluster
    ip = probes.server_ip
    probes.apply(
        "server",
        {
            "metadata": {"name": "default-deny"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
        },
    )
    wait_until(lambda: not probes.reaches("other", ip, SERVER_PORT), POLICY_SEEN, interval=0.5)
    # What a stale cluster's cleanup (python -m testbed.kubernetes --cleanup) would remove.
    stale = Cluster.from_state(cluster.root)
    assert sorted(stale.iptables_chains) == sorted(["mangle", h, c] for h, c in CHAINS.items())
    assert [(p.name, p.stop_signal) for p in stale.procs if p.name == NAME] == [
        (NAME, signal.SIGINT)
    ]

    network_policies.stop()

    assert probes.reaches("other", ip, SERVER_PORT)  # the policy is still there
    assert not network_policies.proc.alive() and not queue_bound(QUEUE)
    mangle = subprocess.run(
        ["iptables-save", "-t", "mangle"], capture_output=True, text=True, check=True
    )
    assert "RF-KNP" not in mangle.stdout
    assert Cluster.from_state(cluster.root).iptables_chains == []
    network_policies.stop()  # idempotent: the fixture's teardown calls it again
