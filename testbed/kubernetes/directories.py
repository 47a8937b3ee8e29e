"""Where clusters live (``$RF_CLUSTER_TMP/rf-cluster-*``, ``/var/tmp`` by default): a new
cluster's directory, and the tear-down of the clusters whose owner process is gone."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from testbed.kubernetes.builds import build_binaries, build_knative
from testbed.kubernetes.cluster import Cluster


def cluster_parent() -> Path:
    return Path(os.environ.get("RF_CLUSTER_TMP", "/var/tmp"))


def cleanup_stale(parent: Path | None = None) -> list[Path]:
    """Tear down the clusters whose owner process is gone (a test run killed with SIGKILL,
    a machine handed over mid-run): processes, mounts, bridge, iptables, cgroups, sysctls.
    Returns their directories."""
    cleaned = []
    for root in sorted((parent or cluster_parent()).glob("rf-cluster-*")):
        if not (root / "state.json").is_file():
            continue
        try:
            cluster = Cluster.from_state(root)
        except (ValueError, KeyError, OSError):
            continue
        if cluster.owner != os.getpid() and Path(f"/proc/{cluster.owner}").exists():
            continue  # its owner still runs: not stale
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        cleaned.append(root)
    return cleaned


def new_cluster(keep: bool = False) -> Cluster:
    """A cluster (not started) in a new directory; stale clusters are torn down first."""
    bin_dir = build_binaries()
    tools = build_knative()
    for root in cleanup_stale():
        print(f"[cluster] tore down the stale cluster in {root}", file=sys.stderr)
    parent = cluster_parent()
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rf-cluster-", dir=parent))
    return Cluster(root=root, bin_dir=bin_dir, keep=keep, coredns_bin=tools["coredns"])
