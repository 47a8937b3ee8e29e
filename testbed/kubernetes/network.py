"""The cluster's network on this machine: the CNI bridge and its configuration, the FORWARD
rules that keep pods on this machine, the iptables chains of add-ons (NetworkPolicy
enforcement), and the removal of what the kubelet, kube-proxy and add-ons leave in netfilter.

Every rule and chain made here is recorded in the cluster's state file before it is made, so
that a stale cluster's cleanup removes it too."""

from __future__ import annotations

import json
import shutil
import subprocess

from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.layout import BRIDGE, GATEWAY, POD_SUBNET, SERVICE_RANGE
from testbed.kubernetes.processes import ClusterError, run

Chain = tuple[str, str, str]  # (tool, table, chain)


def create(cluster: ClusterBase) -> None:
    """The CNI bridge with the gateway address, created here so that servers can bind to
    that address before any pod exists; the bridge plugin adopts it."""
    prefix = POD_SUBNET.split("/")[1]
    shown = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False)
    if shown.returncode == 0:
        raise ClusterError(
            f"bridge {BRIDGE} exists already: another test cluster is "
            f"running, or one was not torn down (ip link delete {BRIDGE})"
        )
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    cluster.bridge_created = True
    cluster.save_state()
    run(["ip", "addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    # Pods may talk to this machine (and to each other) only: drop anything the host
    # would forward between the bridge and another interface.
    for rule in (
        ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"],
        ["FORWARD", "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP"],
    ):
        run(["iptables", "-w", "-I", *rule])
        cluster.iptables_rules.append(rule)
        cluster.save_state()
    write_cni_config(cluster)


def write_cni_config(cluster: ClusterBase) -> None:
    cni_dir = cluster.root / "cni" / "net.d"
    cni_dir.mkdir(parents=True, exist_ok=True)
    conf = {
        "cniVersion": "0.4.0",
        "name": "rf-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                # The subnet's route and the Service range's (kube-proxy DNATs it on this
                # machine), no default route.
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(cluster.root / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                    "routes": [{"dst": SERVICE_RANGE}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (cni_dir / "10-rf-pods.conflist").write_text(json.dumps(conf, indent=1))


def add_chain(
    cluster: ClusterBase, table: str, hook: str, chain: str, rules: list[list[str]]
) -> None:
    """A chain of ``rules`` in ``table``, jumped to at the end of the built-in ``hook``."""
    entry = [table, hook, chain]
    remove_chain(cluster, entry)  # left by a cluster whose state was lost
    cluster.iptables_chains.append(entry)
    cluster.save_state()
    run(["iptables", "-w", "-t", table, "-N", chain])
    for rule in rules:
        run(["iptables", "-w", "-t", table, "-A", chain, *rule])
    run(["iptables", "-w", "-t", table, "-A", hook, "-j", chain])


def remove_chain(cluster: ClusterBase, entry: list[str]) -> None:
    """The chain ``[table, hook, chain]``, its jumps from ``hook`` and its record."""
    table, hook, chain = entry
    ipt = ["iptables", "-w", "-t", table]
    delete = [*ipt, "-D", hook, "-j", chain]
    while subprocess.run(delete, capture_output=True, check=False).returncode == 0:
        pass
    subprocess.run([*ipt, "-F", chain], capture_output=True, check=False)
    subprocess.run([*ipt, "-X", chain], capture_output=True, check=False)
    if entry in cluster.iptables_chains:
        cluster.iptables_chains.remove(entry)
        cluster.save_state()


def remove_nft_tables(cluster: ClusterBase) -> None:
    """The nftables tables that stopped processes may have left behind."""
    if shutil.which("nft"):
        for family, name in cluster.nft_tables:
            subprocess.run(
                ["nft", "delete", "table", family, name], capture_output=True, check=False
            )
    cluster.nft_tables.clear()


def kube_chains() -> set[Chain]:
    """(tool, table, chain) of every KUBE-* iptables chain on this machine."""
    found = set()
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            done = subprocess.run(
                [tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            for line in done.stdout.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "-N" and parts[1].startswith("KUBE-"):
                    found.add((tool, table, parts[1]))
    return found


def remove_kubelet_chains(cluster: ClusterBase) -> None:
    """The kubelet's iptables chains (KUBE-FIREWALL and its jumps from INPUT/OUTPUT, the
    canary and hint chains) and any kube-proxy left, unless they existed before this
    cluster started them."""
    for tool, table, chain in sorted(kube_chains() - cluster.preexisting_chains):
        if (tool, table, chain) == (tool, "filter", "KUBE-FIREWALL"):
            for hook in ("INPUT", "OUTPUT"):
                while (
                    subprocess.run(
                        [tool, "-w", "-t", table, "-D", hook, "-j", chain],
                        capture_output=True,
                        check=False,
                    ).returncode
                    == 0
                ):
                    pass
        subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
        subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False)


def remove_rules_and_bridge(cluster: ClusterBase) -> None:
    """The FORWARD rules, then the bridge, if this cluster made them."""
    for rule in reversed(cluster.iptables_rules):
        subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, check=False)
    cluster.iptables_rules.clear()
    if cluster.bridge_created:
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        cluster.bridge_created = False
