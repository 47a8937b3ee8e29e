"""Builds the test resource image with buildah: busybox plus /opt/resource scripts, no registry.

The tag carries a hash of the scripts, so an unchanged image is reused across runs.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).parent / "images" / "test-resource"
BUSYBOX = "/bin/busybox"


def scripts_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(SCRIPTS.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def image_exists(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name]).returncode == 0


def build_test_resource(name: str = "localhost/rf-test-resource") -> str:
    """Build (or reuse) the image; returns its full reference."""
    ref = f"{name}:{scripts_hash()}"
    if image_exists(ref):
        return ref
    container = _run("buildah", "from", "scratch")
    try:
        root = Path(_run("buildah", "mount", container))
        _install_busybox(root)
        target = root / "opt" / "resource"
        target.mkdir(parents=True)
        for path in SCRIPTS.iterdir():
            shutil.copy2(path, target / path.name)
        (root / "tmp").mkdir(mode=0o1777)
        _run("buildah", "config", "--env", "PATH=/bin", container)
        _run("buildah", "commit", "--quiet", container, ref)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)
    return ref


def _install_busybox(root: Path) -> None:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        if applet != "busybox":
            (bin_dir / applet).symlink_to("busybox")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
