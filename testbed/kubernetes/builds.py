"""What the cluster runs that is built here, each by a script of this folder that caches its
build under ``~/.cache/resource-functions`` and prints where it is: the Kubernetes binaries
(``build.sh``), Knative, CoreDNS and the test KIngress (``build_knative.sh``); and the Debian
tools it needs installed (``.ci/cluster`` installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from testbed.kubernetes.processes import ClusterError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
K8S_VERSION = os.environ.get("K8S_VERSION", "v1.34.4")


def build_binaries() -> Path:
    """The directory of the four Kubernetes binaries (built on first use: minutes)."""
    script = HERE / "build.sh"
    done = subprocess.run(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "K8S_VERSION": K8S_VERSION},
        check=False,
    )
    if done.returncode != 0:
        raise ClusterError(f"{shown(script)} exited with status {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


def build_knative() -> dict[str, Path]:
    """Directories of the Knative binaries and manifests (``eventing``, ``serving``), of
    ``coredns`` and of ``kingress`` (built on first use: minutes)."""
    return build_tools(HERE / "build_knative.sh")


def build_tools(script: Path) -> dict[str, Path]:
    """Run ``script`` (a build, cached by the script); the ``NAME=DIR`` lines it prints, as a
    dict."""
    done = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{shown(script)} exited with status {done.returncode}")
    return {
        name: Path(path)
        for name, _, path in (
            line.partition("=") for line in done.stdout.splitlines() if "=" in line
        )
    }


def shown(script: Path) -> str:
    """``script``'s path from the repository's root, as the docs name it."""
    return str(script.relative_to(REPO)) if script.is_relative_to(REPO) else str(script)


def need(*tools: str) -> None:
    """``ClusterError`` naming the ``tools`` missing from PATH, if any."""
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise ClusterError(
            f"missing {', '.join(missing)}: run .ci/cluster (installs "
            "containerd, etcd-server, containernetworking-plugins, iptables)"
        )
