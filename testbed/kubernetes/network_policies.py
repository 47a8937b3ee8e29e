"""NetworkPolicy enforcement on the test cluster, for the tests that turn it on.

    enforcement = enforce_network_policies(cluster)   # on until enforcement.stop() or
                                                      # cluster.stop() (or a stale cleanup)

The enforcer is kube-network-policies v0.8.0 (``build_network_policies.sh``), the one kind uses,
run on this machine as kind runs it in its DaemonSet (host network, root). It judges the first
packet of each connection that netfilter queues to it (NFQUEUE) against the API's
NetworkPolicies, pods and namespaces, and drops what no policy allows.

Two departures from the upstream install, both forced by this machine:

- Its own nftables rules use the nft ``queue`` expression, which this kernel lacks
  (``CONFIG_NFT_QUEUE`` is not set; no module can be loaded): it logs "syncing nftables rules"
  errors and enforces nothing. The same rules are written here with iptables' ``NFQUEUE``
  target (``xt_NFQUEUE``, which this kernel has): ``mangle POSTROUTING`` as its postrouting
  chain, with pod addresses by range in place of its set of selected pods.
- Its chains do not see what pods send to this machine (the node IP: the apiserver, CoreDNS,
  the tests' S3, the test KIngress): that traffic is delivered locally and never crosses
  POSTROUTING. One ``mangle INPUT`` chain queues the new connections arriving from pods on the
  bridge, so that egress policies about the node IP are enforced too.

As upstream, traffic that this machine's root processes send is never queued (``--uid-owner
0``: the kubelet's probes, the test KIngress, the functions run as host processes), nor are
established connections. The rules bypass the queue when nothing listens (``--queue-bypass``):
a dead enforcer lets everything through, so a test of a policy must also see it deny something.

The process has no ``--kubeconfig`` flag (in-cluster configuration only): it runs in a private
mount namespace whose ``/run`` holds a TokenRequest token of its ServiceAccount and the CA.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from functions.cli.launch import free_port
from testbed.kubernetes.cluster import Cluster
from testbed.kubernetes.layout import BRIDGE, GATEWAY, NODE_NAME, POD_SUBNET
from testbed.kubernetes.processes import ClusterError, Proc, tail

HERE = Path(__file__).resolve().parent

NAME = "kube-network-policies"
NAMESPACE = "kube-system"
QUEUE = 100
CHAINS = {"POSTROUTING": "RF-KNP-POSTROUTING", "INPUT": "RF-KNP-INPUT"}  # mangle hook -> chain
START_TIMEOUT = 60.0
READ = ["list", "watch"]
# In its mount namespace: a fresh /run with the in-cluster token and CA, then the binary with
# only the two in-cluster variables. Arguments: run dir, token dir, the command.
IN_CLUSTER = (
    'set -e; mount -t tmpfs -o size=1m,mode=0755 rf-knp "$1"; '
    'd="$1/secrets/kubernetes.io/serviceaccount"; mkdir -p "$d"; '
    'cp "$2/token" "$2/ca.crt" "$d/"; shift 2; exec "$@"'
)


def build() -> Path:
    """The directory of the kube-network-policies binary (built on first use: minutes)."""
    done = subprocess.run(
        ["bash", str(HERE / "build_network_policies.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ClusterError(f"build_network_policies.sh exited with status {done.returncode}")
    return Path(done.stdout.strip().rpartition("=")[2])


def rbac() -> dict:
    """Its ServiceAccount and the read access it needs (list/watch pods, namespaces,
    NetworkPolicies), bound cluster-wide."""
    meta = {"name": NAME}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {**meta, "namespace": NAMESPACE},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": meta,
                "rules": [
                    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": READ},
                    {
                        "apiGroups": ["networking.k8s.io"],
                        "resources": ["networkpolicies"],
                        "verbs": READ,
                    },
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": meta,
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": NAME,
                },
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            },
        ],
    }


def pod_ranges(subnet: str, gateway: str) -> list[str]:
    """The addresses host-local IPAM gives pods: the subnet's hosts but the gateway, as
    ``first-last`` ranges (one or two)."""
    net = ipaddress.ip_network(subnet)
    gw = ipaddress.ip_address(gateway)
    first, last = net.network_address + 1, net.broadcast_address - 1
    spans = [(first, gw - 1), (gw + 1, last)] if first <= gw <= last else [(first, last)]
    return [f"{a}-{b}" for a, b in spans if a <= b]


def chain_rules(bridge: str, ranges: list[str], queue: int) -> dict[str, list[list[str]]]:
    """mangle hook -> the rules of our chain there. New connections from or to a pod are
    queued (POSTROUTING: forwarded and this machine's non-root traffic; INPUT: pods to this
    machine), except what this machine's root sends and established connections."""
    target = ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
    known = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"]
    post = [["-m", "owner", "--uid-owner", "0", "-j", "RETURN"], known]
    for span in ranges:
        post += [["-m", "iprange", "--src-range", span, *target]]
        post += [["-m", "iprange", "--dst-range", span, *target]]
    incoming = [["!", "-i", bridge, "-j", "RETURN"], known]
    incoming += [["-m", "iprange", "--src-range", span, *target] for span in ranges]
    return {"POSTROUTING": post, "INPUT": incoming}


def queue_bound(queue: int) -> bool:
    """A process listens on nfqueue ``queue`` (it binds once its informers have synced)."""
    try:
        lines = Path("/proc/net/netfilter/nfnetlink_queue").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[:1] == [str(queue)] for line in lines)


@dataclass
class NetworkPolicyEnforcement:
    cluster: Cluster
    proc: Proc

    @property
    def log(self) -> Path:
        return self.proc.log

    def enforcing(self) -> bool:
        """The enforcer runs, listens on its queue, and the queueing chains are in place."""
        return (
            self.proc.alive()
            and queue_bound(QUEUE)
            and all(_jumps("mangle", hook, chain) for hook, chain in CHAINS.items())
        )

    def assert_enforcing(self) -> None:
        assert self.enforcing(), f"{NAME} is not enforcing:\n{tail(self.log)}"

    def stop(self) -> None:
        """Enforcement off: the queueing chains first (nothing waits on a dead queue), then
        the process (SIGINT: its own cleanup), then any table it left. Idempotent."""
        for hook, chain in CHAINS.items():
            self.cluster.remove_iptables_chain(["mangle", hook, chain])
        if self.proc in self.cluster.procs:
            self.cluster.end(self.proc)
        self.cluster.remove_nft_tables()


def enforce_network_policies(cluster: Cluster) -> NetworkPolicyEnforcement:
    """Start enforcing NetworkPolicies on ``cluster`` (seconds; the first call on a machine
    builds the binary). Pods no policy selects keep all their traffic."""
    if queue_bound(QUEUE):
        raise ClusterError(f"nfqueue {QUEUE} is taken: another enforcer runs on this machine")
    bridged = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if not bridged.is_file() or bridged.read_text().strip() != "1":
        raise ClusterError(f"{bridged} is not 1: pod-to-pod traffic would not be filtered")
    binary = build() / NAME
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(rbac()))
    token_dir = cluster.root / NAME
    token_dir.mkdir(mode=0o700, exist_ok=True)
    token = cluster.kubectl("-n", NAMESPACE, "create", "token", NAME, "--duration=24h").strip()
    (token_dir / "token").write_text(token)
    (token_dir / "ca.crt").write_bytes(cluster.ca.cert.read_bytes())
    if ["inet", NAME] not in cluster.nft_tables:  # its own table, should it ever make one
        cluster.nft_tables.append(["inet", NAME])
    proc = cluster.spawn(
        NAME,
        [
            *("unshare", "--mount", "--propagation", "private", "sh", "-c", IN_CLUSTER, "sh"),
            *(os.path.realpath("/var/run"), str(token_dir)),
            *("env", "-i", f"KUBERNETES_SERVICE_HOST={GATEWAY}"),
            f"KUBERNETES_SERVICE_PORT={cluster.api_port}",
            str(binary),
            f"--hostname-override={NODE_NAME}",
            f"--nfqueue-id={QUEUE}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            # The DNS race it works around is fixed in kernels 6.12+; without the workaround
            # every packet is judged where the rules below queue it, DNS included.
            "--netfilter-bug-1766-fix=false",
            "--v=2",  # each packet's verdict in its log
        ],
        stop_signal=signal.SIGINT,
    )
    enforcement = NetworkPolicyEnforcement(cluster, proc)
    try:
        _wait_bound(proc)
        rules = chain_rules(BRIDGE, pod_ranges(POD_SUBNET, GATEWAY), QUEUE)
        for hook, chain in CHAINS.items():
            cluster.add_iptables_chain("mangle", hook, chain, rules[hook])
    except BaseException:
        enforcement.stop()
        raise
    cluster.note(f"{NAME} enforcing NetworkPolicies (log: {proc.log})")
    return enforcement


def _wait_bound(proc: Proc) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not queue_bound(QUEUE):
        if not proc.alive() or time.monotonic() > deadline:
            raise ClusterError(f"{NAME} did not bind nfqueue {QUEUE}:\n{tail(proc.log)}")
        time.sleep(0.2)


def _jumps(table: str, hook: str, chain: str) -> bool:
    check = ["iptables", "-w", "-t", table, "-C", hook, "-j", chain]
    return subprocess.run(check, capture_output=True, check=False).returncode == 0
