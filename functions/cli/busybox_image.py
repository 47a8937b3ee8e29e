"""Build a resource image with no registry: busybox plus /opt/resource scripts, via buildah.

Used by ``python -m functions demo`` and by the tests. The tag is a hash of the scripts, so
an unchanged image is reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

BUSYBOX = "/bin/busybox"


def scripts_hash(scripts: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(scripts.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def build_resource_image(name: str, scripts: Path) -> str:
    """Build (or reuse) ``name:<hash>`` holding busybox and ``scripts`` in /opt/resource."""
    ref = f"{name}:{scripts_hash(scripts)}"
    if subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        return ref
    container = _run("buildah", "from", "scratch")
    try:
        root = Path(_run("buildah", "mount", container))
        _install_busybox(root)
        target = root / "opt" / "resource"
        target.mkdir(parents=True)
        for path in scripts.iterdir():
            shutil.copy2(path, target / path.name)
        (root / "tmp").mkdir(mode=0o1777)
        _run("buildah", "config", "--env", "PATH=/bin", container)
        _run("buildah", "commit", "--quiet", container, ref)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
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
