"""A real single-node Kubernetes on this machine, for the end-to-end tests (and by hand).

    python -m testbed.kubernetes          # start, wait for the node, print how to use it,
                                          # tear everything down on Ctrl-C / SIGTERM
    python -m testbed.kubernetes --check  # start, wait for the node, tear down, exit

Pieces, each a process of this machine started here (no systemd, nothing left behind):

    etcd                     Debian's etcd-server, on 127.0.0.1
    kube-apiserver           x509 + service-account tokens, Node,RBAC authorization, on the
                             bridge's host-side address (the gateway), where pods reach it
    kube-controller-manager  Job, garbage-collector, TTL, service-account-token ... controllers
    kube-scheduler
    containerd               Debian's, CRI with runc and cgroupfs, state under the cluster dir,
                             sandbox image = a locally built pause image
    kubelet                  cgroupfs, failCgroupV1: false, failSwapOn: false
    kube-proxy               iptables mode: Service IPs work from pods and from this machine
    coredns                  cluster DNS for cluster.local on the gateway; nothing else resolves

The Kubernetes binaries come from ``testbed/kubernetes/build.sh`` (``go build`` of the
k8s.io/kubernetes module, cached under ``~/.cache/resource-functions/kubernetes/<version>``),
CoreDNS from ``testbed/kubernetes/build_knative.sh``.

Network: pods live on the CNI bridge ``rfcni0`` (Debian's bridge + host-local plugins) with the
private subnet 10.244.0.0/24 that exists only inside this machine. The bridge's host-side
address (10.244.0.1, the node IP) is an address of this machine: pods reach servers bound to it
(the tests' S3, the apiserver, the cluster DNS). Pods get a route to the subnet and one to the
Service range (kube-proxy translates it on this machine), no default route, and the host
forwards nothing from or to the bridge, so they can reach nothing else.

Tear-down (``Cluster.stop``, also on a failed start): pods stopped, kubelet, containerd and the
container shims killed (by pid), mounts under the cluster dir unmounted, the bridge and the
iptables rules removed, the kubelet's cgroups removed, the kernel settings the kubelet changed
restored, the directory deleted.

The modules, one idea each: ``base`` (what every piece works on: the directory, the record of
what was made, processes, clients), ``cluster`` (the Cluster: start and stop), ``layout``
(names and addresses), ``processes`` (Proc, ClusterError), ``builds`` (the build scripts of
this folder), ``certificates`` and ``pki``, ``network`` (bridge, FORWARD rules, iptables
chains), ``control_plane``, ``node`` (containerd, kubelet), ``containerd_images`` (the pause
image, imports), ``teardown``, ``directories`` (new and stale clusters); add-ons: ``knative``
(Knative and the test KIngress of ``kingress/``) and ``network_policies`` (NetworkPolicy
enforcement). The cluster tests' fixtures are in ``tests/cluster/``.
"""

from testbed.kubernetes.builds import K8S_VERSION, build_binaries, build_knative, build_tools
from testbed.kubernetes.cluster import Cluster
from testbed.kubernetes.directories import cleanup_stale, cluster_parent, new_cluster
from testbed.kubernetes.layout import (
    BRIDGE,
    CLUSTER_DOMAIN,
    GATEWAY,
    NODE_NAME,
    POD_SUBNET,
    SERVICE_IP,
    SERVICE_RANGE,
)
from testbed.kubernetes.processes import ClusterError, Proc

__all__ = [
    "BRIDGE",
    "CLUSTER_DOMAIN",
    "GATEWAY",
    "K8S_VERSION",
    "NODE_NAME",
    "POD_SUBNET",
    "SERVICE_IP",
    "SERVICE_RANGE",
    "Cluster",
    "ClusterError",
    "Proc",
    "build_binaries",
    "build_knative",
    "build_tools",
    "cleanup_stale",
    "cluster_parent",
    "new_cluster",
]
