"""The control plane and the services every node needs, each a process of this machine:
etcd (Debian's, on 127.0.0.1), kube-apiserver (on the gateway, with an audit log of the
functions' ServiceAccount), kube-controller-manager, kube-scheduler, kube-proxy (iptables mode:
Service IPs work from pods and from this machine) and CoreDNS (cluster DNS on the gateway;
nothing else resolves). Each ``start_*`` returns once its process serves."""

from __future__ import annotations

import json
from pathlib import Path

import requests

from functions.cli.launch import free_port
from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.layout import CLUSTER_DOMAIN, GATEWAY, NODE_NAME, POD_SUBNET, SERVICE_RANGE
from testbed.kubernetes.network import kube_chains
from testbed.kubernetes.processes import ClusterError, wait_ready

# The API requests the audit log records (``Cluster.audit_log``): the functions' ServiceAccount
# (knative/rbac.yaml), whose requests per run the load test counts. Nobody else's: the
# controllers' leader elections alone would write lines every second.
AUDITED_USERS = ("system:serviceaccount:resource-functions:resource-functions",)


def start_etcd(cluster: ClusterBase) -> None:
    client, peer = free_port(), free_port()
    cluster.etcd_url = f"http://127.0.0.1:{client}"
    proc = cluster.spawn(
        "etcd",
        [
            "etcd",
            "--name",
            "rf",
            "--data-dir",
            str(cluster.root / "etcd"),
            "--listen-client-urls",
            cluster.etcd_url,
            "--advertise-client-urls",
            cluster.etcd_url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"rf=http://127.0.0.1:{peer}",
            "--listen-metrics-urls",
            f"http://127.0.0.1:{free_port()}",
            "--unsafe-no-fsync",
            "--snapshot-count",
            "10000",
            "--log-level",
            "warn",
        ],
    )
    wait_ready(proc, lambda: requests.get(cluster.etcd_url + "/health", timeout=1).ok, "healthy")


def audit_policy(cluster: ClusterBase) -> Path:
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": list(AUDITED_USERS)},
            {"level": "None"},
        ],
    }
    path = cluster.root / "audit-policy.json"
    path.write_text(json.dumps(policy))
    return path


def start_apiserver(cluster: ClusterBase) -> None:
    p = cluster.pki_dir
    proc = cluster.spawn(
        "kube-apiserver",
        [
            str(cluster.bin_dir / "kube-apiserver"),
            "--etcd-servers",
            cluster.etcd_url,
            # On the gateway only: pods reach it there (the lease reconciler makes that the
            # endpoint of the kubernetes Service), and nothing outside this machine does.
            "--bind-address",
            GATEWAY,
            "--secure-port",
            str(cluster.api_port),
            "--advertise-address",
            GATEWAY,
            "--endpoint-reconciler-type",
            "lease",
            "--tls-cert-file",
            str(cluster.apiserver_cert.cert),
            "--tls-private-key-file",
            str(cluster.apiserver_cert.key),
            "--client-ca-file",
            str(cluster.ca.cert),
            "--service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file",
            str(cluster.sa_keys.cert),
            "--service-account-signing-key-file",
            str(cluster.sa_keys.key),
            "--service-cluster-ip-range",
            SERVICE_RANGE,
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--allow-privileged=true",
            "--kubelet-client-certificate",
            str(cluster.apiserver_kubelet.cert),
            "--kubelet-client-key",
            str(cluster.apiserver_kubelet.key),
            "--kubelet-certificate-authority",
            str(cluster.ca.cert),
            "--kubelet-preferred-address-types",
            "InternalIP",
            "--profiling=false",
            "--v=1",
            # Its key-count refresher polls the watch cache at etcd's newest revision; etcd
            # 3.4 sends no watch progress notifications, so that fails every second or so
            # ("Error getting keys ... Too large resource version"): noise, turned off.
            "--feature-gates",
            "SizeBasedListCostEstimate=false",
            "--cert-dir",
            str(p / "apiserver-generated"),
            "--audit-policy-file",
            str(audit_policy(cluster)),
            "--audit-log-path",
            str(cluster.audit_log),
            "--audit-log-format",
            "json",
            "--audit-log-mode",
            "blocking",
        ],
    )
    admin = cluster.ca.issue("probe-client", "rf-probe", orgs=("system:masters",), client=True)
    # verify= per request: a Session's verify loses to REQUESTS_CA_BUNDLE in the env.
    wait_ready(
        proc,
        lambda: (
            requests.get(
                cluster.server + "/readyz",
                timeout=2,
                cert=(str(admin.cert), str(admin.key)),
                verify=str(cluster.ca.cert),
            ).ok
        ),
        "ready",
        timeout=90,
    )


def start_controller_manager(cluster: ClusterBase) -> None:
    start_controller(
        cluster,
        "controller-manager",
        [
            "--use-service-account-credentials=true",
            "--service-account-private-key-file",
            str(cluster.sa_keys.key),
            "--root-ca-file",
            str(cluster.ca.cert),
            "--cluster-signing-cert-file",
            str(cluster.ca.cert),
            "--cluster-signing-key-file",
            str(cluster.ca.key),
            "--allocate-node-cidrs=false",
            "--cluster-name",
            "rf-test",
        ],
    )


def start_scheduler(cluster: ClusterBase) -> None:
    start_controller(cluster, "scheduler", [])


def start_controller(cluster: ClusterBase, name: str, options: list[str]) -> None:
    """``kube-<name>`` with its own kubeconfig, serving on loopback, the only one (no leader
    election), with ``options``."""
    kubeconfig = str(cluster.root / f"{name}.kubeconfig")
    cluster.spawn(
        f"kube-{name}",
        [
            str(cluster.bin_dir / f"kube-{name}"),
            "--kubeconfig",
            kubeconfig,
            "--authentication-kubeconfig",
            kubeconfig,
            "--authorization-kubeconfig",
            kubeconfig,
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(free_port()),
            "--leader-elect=false",
            *options,
            "--cert-dir",
            str(cluster.pki_dir / f"{name}-generated"),
            "--v=1",
        ],
    )


def start_kube_proxy(cluster: ClusterBase) -> None:
    # KUBE-* chains made from here on (kube-proxy's, the kubelet's) are removed on stop.
    cluster.preexisting_chains = kube_chains()
    health = free_port()
    proc = cluster.spawn(
        "kube-proxy",
        [
            str(cluster.bin_dir / "kube-proxy"),
            "--kubeconfig",
            str(cluster.root / "kube-proxy.kubeconfig"),
            "--hostname-override",
            NODE_NAME,
            "--proxy-mode",
            "iptables",
            "--cluster-cidr",
            POD_SUBNET,
            # Root here may not change the conntrack sysctls; leave them as they are.
            "--conntrack-max-per-core",
            "0",
            "--iptables-localhost-nodeports=false",
            "--healthz-bind-address",
            f"127.0.0.1:{health}",
            "--metrics-bind-address",
            f"127.0.0.1:{free_port()}",
            "--v=1",
        ],
    )
    wait_ready(
        proc, lambda: requests.get(f"http://127.0.0.1:{health}/livez", timeout=1).ok, "serving"
    )


def start_coredns(cluster: ClusterBase) -> None:
    """Cluster DNS on the gateway's port 53: ``cluster.local`` and reverse lookups from the
    API; any other name is REFUSED (nothing may leave this machine)."""
    if cluster.coredns_bin is None:
        raise ClusterError("no coredns binary: run testbed/kubernetes/build_knative.sh")
    ready = free_port()
    corefile = cluster.root / "Corefile"
    corefile.write_text(f"""\
.:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {cluster.admin_kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")
    proc = cluster.spawn("coredns", [str(cluster.coredns_bin / "coredns"), "-conf", str(corefile)])
    wait_ready(proc, lambda: requests.get(f"http://127.0.0.1:{ready}/ready", timeout=1).ok, "ready")
