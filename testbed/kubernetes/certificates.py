"""The cluster's certificates (one CA, ``pki.py``) and the kubeconfigs of its pieces.

Each kubeconfig names the apiserver at the gateway and ``cluster.api_port``, which the first
one written chooses (the apiserver starts later, on that port)."""

from __future__ import annotations

import json
from pathlib import Path

from functions.cli.launch import free_port
from testbed.kubernetes import pki
from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.layout import GATEWAY, NODE_NAME, SERVICE_IP

# The client identities that get a kubeconfig: name -> (common name, organisations).
CLIENTS = {
    "admin": ("rf-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    "kubelet": (f"system:node:{NODE_NAME}", ("system:nodes",)),
    # Bound to the system:node-proxier ClusterRole by default.
    "kube-proxy": ("system:kube-proxy", ()),
}


def issue(cluster: ClusterBase) -> None:
    """The CA, the serving and client certificates, the service-account keys, and a
    kubeconfig for each of ``CLIENTS`` in the cluster's directory."""
    ca = pki.Authority(cluster.pki_dir)
    cluster.ca = ca
    cluster.apiserver_cert = ca.issue(
        "apiserver",
        "kube-apiserver",
        server=True,
        ips=("127.0.0.1", SERVICE_IP, GATEWAY),
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    cluster.apiserver_kubelet = ca.issue(
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet",
        orgs=("system:masters",),
        client=True,
    )
    cluster.kubelet_serving = ca.issue(
        "kubelet-serving", NODE_NAME, server=True, ips=(GATEWAY,), dns=(NODE_NAME,)
    )
    cluster.sa_keys = ca.service_account_keys()
    for name, (cn, orgs) in CLIENTS.items():
        pair = ca.issue(f"{name}-client", cn, orgs=orgs, client=True)
        write_kubeconfig(
            cluster,
            cluster.root / f"{name}.kubeconfig",
            {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
        )


def write_kubeconfig(cluster: ClusterBase, path: Path, user: dict[str, str]) -> None:
    """A kubeconfig at ``path`` for the cluster's apiserver, authenticating as ``user``."""
    # api_port is chosen here, before the apiserver starts: every kubeconfig names it.
    if not cluster.api_port:
        cluster.api_port = free_port()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "rf",
        "clusters": [
            {
                "name": "rf",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca.cert),
                },
            }
        ],
        "users": [{"name": "rf", "user": user}],
        "contexts": [{"name": "rf", "context": {"cluster": "rf", "user": "rf"}}],
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
