"""Tearing a cluster down, in the order that leaves nothing behind: the add-ons' iptables
chains and processes, the pods (so that CNI releases their addresses), the kubelet, the
containers, containerd and its shims (by pid), every mount under the cluster's directory, the
control plane, the kubelet's cgroups, the kernel settings it changed, the netfilter rules and
chains, the bridge, the directory. Safe to run more than once and after a partial start, and
on a cluster read back from the state file of an owner that died."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from testbed.kubernetes import network, node
from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.layout import RUN_DIR
from testbed.kubernetes.processes import processes, terminate

CORE_PROCS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kube-proxy",
    "coredns",
    "kubelet",
)


def tear_down(cluster: ClusterBase) -> None:
    """Tear everything down; safe to call more than once and after a partial start."""
    by_name = {p.name: p for p in cluster.procs}
    for entry in list(cluster.iptables_chains):  # no filter may outlive the process it needs
        network.remove_chain(cluster, entry)
    for proc in cluster.procs:  # add-ons started with spawn (the test KIngress) go first
        if proc.name not in CORE_PROCS:
            terminate(proc)
    network.remove_nft_tables(cluster)
    if "kubelet" in by_name and "kube-apiserver" in by_name:
        delete_pods(cluster)
    for name in ("kubelet",):
        if name in by_name:
            terminate(by_name[name])
    if "containerd" in by_name:
        kill_containers(cluster)
        terminate(by_name["containerd"])
    kill_shims(cluster)
    unmount(cluster)
    for name in (
        "coredns",
        "kube-proxy",
        "kube-scheduler",
        "kube-controller-manager",
        "kube-apiserver",
        "etcd",
    ):
        if name in by_name:
            terminate(by_name[name])
    if "kube-proxy" in by_name:  # its iptables chains and rules
        subprocess.run(
            [str(cluster.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True, check=False
        )
    cluster.procs.clear()
    remove_cgroups()
    if cluster.made_run_dir:
        remove_empty_dirs(RUN_DIR)
        cluster.made_run_dir = False
    node.restore_sysctls(cluster)
    if "kubelet" in by_name or "kube-proxy" in by_name:
        network.remove_kubelet_chains(cluster)
    network.remove_rules_and_bridge(cluster)
    if not cluster.keep:
        shutil.rmtree(cluster.root, ignore_errors=True)
    else:  # only logs remain: nothing for cleanup_stale to do
        (cluster.root / "state.json").unlink(missing_ok=True)


def delete_pods(cluster: ClusterBase) -> None:
    """Let the kubelet stop every pod (CNI DEL releases its address and veth)."""
    with contextlib.suppress(Exception):
        cluster.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            "--all",
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            listed = cluster.ctr("tasks", "ls", "-q", check=False).stdout.split()
            if len(listed) == 0:
                break
            time.sleep(0.5)


def kill_containers(cluster: ClusterBase) -> None:
    with contextlib.suppress(Exception):
        for task in cluster.ctr("tasks", "ls", "-q", check=False).stdout.split():
            cluster.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        time.sleep(0.5)
        for task in cluster.ctr("tasks", "ls", "-q", check=False).stdout.split():
            cluster.ctr("tasks", "delete", "-f", task, check=False)


def kill_shims(cluster: ClusterBase) -> None:
    """containerd-shim-runc-v2 processes outlive containerd by design: kill ours (those
    whose command line names this cluster's directory), by pid."""
    marker = str(cluster.root).encode()
    for entry, cmdline in processes("cmdline"):
        if b"containerd-shim" in cmdline and marker in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def unmount(cluster: ClusterBase) -> None:
    """Unmount everything under the cluster directory, deepest first."""
    root = str(cluster.root)
    for _ in range(3):
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        ours = sorted(
            {m for m in mounts if m == root or m.startswith(root + "/")}, key=len, reverse=True
        )
        if not ours:
            return
        for mount in ours:
            done = subprocess.run(["umount", mount], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def remove_cgroups() -> None:
    """The kubelet's cgroup tree (kubepods) in every v1 hierarchy, leaves first."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        remove_empty_dirs(hierarchy / "kubepods")


def remove_empty_dirs(top: Path) -> None:
    """``top`` and the directories below it, if (once emptied of empty directories) empty."""
    if not top.is_dir():
        return
    for path in sorted(
        (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    ):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()
