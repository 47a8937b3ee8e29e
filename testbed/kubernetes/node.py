"""The node: containerd (Debian's, CRI with runc and cgroupfs, its state under the cluster's
directory, the locally built pause image as the sandbox) and the kubelet (cgroupfs,
``failCgroupV1: false``, ``failSwapOn: false``, on the gateway), and the kernel settings the
kubelet changes, kept to be restored on stop."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from functions.cli.launch import free_port
from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.layout import CLUSTER_DOMAIN, CNI_BIN, GATEWAY, NODE_NAME, RUN_DIR
from testbed.kubernetes.processes import wait_ready

# Kernel settings the kubelet sets when protectKernelDefaults is false; restored on stop.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def start_containerd(cluster: ClusterBase, sandbox_image: str) -> None:
    base = cluster.root / "containerd"
    base.mkdir(parents=True, exist_ok=True)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""\
version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{cluster.containerd_socket}"

[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  netns_mounts_under_state_dir = true
  # This machine's root lacks CAP_SYS_RESOURCE: no oom_score_adj below containerd's own
  # (the sandbox's -998 fails in runc with "failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{os.environ.get("RF_CLUSTER_RUNC") or shutil.which("runc")}"

[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{cluster.root / "cni" / "net.d"}"

# Registries the tests serve (plain HTTP on the gateway) are named here, one hosts.toml
# each (Cluster.allow_plain_http_registry); containerd reads the directory at every pull.
[{cri}.registry]
  config_path = "{cluster.registry_hosts}"
"""
    (base / "config.toml").write_text(config)
    # containerd 1.6 keeps runc's state and the shims' sockets under /run/containerd
    # whatever its own state directory is; remove what we made there on stop.
    cluster.made_run_dir = not RUN_DIR.exists()
    cluster.save_state()
    proc = cluster.spawn(
        "containerd",
        ["containerd", "--config", str(base / "config.toml"), "--log-level", "info"],
    )
    wait_ready(proc, lambda: cluster.ctr("version", check=False).returncode == 0, "serving")


def start_kubelet(cluster: ClusterBase) -> None:
    kubelet_dir = cluster.root / "kubelet"
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    cluster.kubelet_port = free_port(GATEWAY)
    resolv = cluster.root / "resolv.conf"
    # Name server of pods outside the cluster DNS policy: CoreDNS on the gateway too. (An
    # empty file would make containerd copy this machine's /etc/resolv.conf into pods.)
    resolv.write_text(f"nameserver {GATEWAY}\noptions ndots:1\n")
    socket_url = f"unix://{cluster.containerd_socket}"
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": GATEWAY,
        "port": cluster.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cluster.ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(cluster.kubelet_serving.cert),
        "tlsPrivateKeyFile": str(cluster.kubelet_serving.key),
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": socket_url,
        "imageServiceEndpoint": socket_url,
        "resolvConf": str(resolv),
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [GATEWAY],
        "podLogsDir": str(cluster.root / "pod-logs"),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 110,  # the kubelet's default: the load test runs 20 Jobs beside Knative
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "5s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }
    (kubelet_dir / "config.json").write_text(json.dumps(config, indent=1))
    save_sysctls(cluster)
    cluster.save_state()
    cluster.spawn(
        "kubelet",
        [
            str(cluster.bin_dir / "kubelet"),
            "--config",
            str(kubelet_dir / "config.json"),
            "--kubeconfig",
            str(cluster.root / "kubelet.kubeconfig"),
            "--root-dir",
            str(kubelet_dir),
            "--hostname-override",
            NODE_NAME,
            "--node-ip",
            GATEWAY,
            "--v=2",
        ],
    )


def save_sysctls(cluster: ClusterBase) -> None:
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            cluster.sysctls[name] = (Path("/proc/sys") / name).read_text().strip()


def wait_node_ready(cluster: ClusterBase, deadline: float) -> None:
    kubelet = next(p for p in cluster.procs if p.name == "kubelet")

    def ready() -> bool:
        out = cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if not out:
            return False
        node = json.loads(out)
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
        taints = node.get("spec", {}).get("taints") or []
        return conditions.get("Ready") == "True" and not taints

    wait_ready(kubelet, ready, "Ready (node)", timeout=max(5.0, deadline - time.monotonic()))


def restore_sysctls(cluster: ClusterBase) -> None:
    for name, value in cluster.sysctls.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value)
    cluster.sysctls.clear()
