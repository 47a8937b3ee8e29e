"""Images for the test cluster without a registry: a locally built pause (sandbox) image, and
copying local Podman images into containerd's ``k8s.io`` namespace, where the kubelet finds them
(pods use ``imagePullPolicy: IfNotPresent`` or a non-``latest`` tag, so nothing is pulled)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause.go"
PAUSE_IMAGE = "localhost/rf-pause"


def run(argv: list[str], **kwargs) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited with {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done.stdout.strip()


def pause_image(cache: Path) -> str:
    """``localhost/rf-pause:<hash of pause.go>``: a static Go program that holds the pod's
    namespaces and reaps orphans, built with ``go build`` and committed with buildah."""
    tag = hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest()[:12]
    ref = f"{PAUSE_IMAGE}:{tag}"
    if subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        return ref
    binary = cache / f"pause-{tag}"
    if not binary.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        run(
            ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), str(PAUSE_SOURCE)],
            env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"},
            cwd=cache,
        )
    container = run(["buildah", "from", "scratch"])
    try:
        run(["buildah", "copy", "--chmod", "0755", container, str(binary), "/pause"])
        run(["buildah", "config", "--entrypoint", '["/pause"]', "--cmd", "", container])
        run(["buildah", "commit", "--quiet", container, ref])
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def import_image(socket: Path, ref: str, workdir: Path) -> None:
    """``podman save --format oci-archive`` (uncompressed layers: no gzip round trip) then
    ``ctr -n k8s.io images import``."""
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / (hashlib.sha256(ref.encode()).hexdigest()[:16] + ".tar")
    try:
        run(
            [
                "podman",
                "save",
                "--quiet",
                "--uncompressed",
                "--format",
                "oci-archive",
                "-o",
                str(archive),
                ref,
            ]
        )
        run(
            [
                "ctr",
                "--address",
                str(socket),
                "-n",
                "k8s.io",
                "images",
                "import",
                "--base-name",
                ref.rsplit(":", 1)[0],
                str(archive),
            ]
        )
        listed = run(["ctr", "--address", str(socket), "-n", "k8s.io", "images", "ls", "-q"])
        if ref not in listed.split():
            raise RuntimeError(f"{ref} is not in containerd after the import; it has: {listed}")
    finally:
        archive.unlink(missing_ok=True)
