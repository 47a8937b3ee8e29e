"""Resource images of our own for the fidelity tests, on the local Debian base
(``tests/support/project_image.py``), and the reference their trees are compared with.

    rootfs_resource() -> "localhost/rf-rootfs-resource:<hash>"
        the base plus the special cases it lacks (another owner, a file capability, user
        attributes, links climbing out or to /proc); its ``in`` copies the image's own root
        filesystem into the output with its manifest (tests/support/images/rootfs-resource)
    git_repo_resource() -> "localhost/rf-git-repo-resource:<hash>"
        the base plus Debian's git: check, in (clone) and out (commit, push) against a git
        server (tests/support/images/git-repo-resource)
    podman_image(name, containerfile, scripts, as_name) -> "localhost/<name>:<hash>"
        an image of a Containerfile on the base with a folder of scripts in its context
    manifest(tree, *tops) -> list of entries
        tests/support/images/rootfs-resource/manifest run on this machine: the tree entry by entry
    image_manifest(ref, tops), mismatches(actual, expected)
        the image's own filesystem as Podman stores it; what differs, entry by entry
    unpack_artifact(store, artifact, into)
        a reply's artifact unpacked (digest verified), as a put's stage does

Tags hash what goes in (the base image's id, the recipe, the scripts): an unchanged image is
reused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from storage.archive import format_for_key, unpack
from storage.base import key_for_url
from tests.support.archive_trees import NET_RAW_CAPABILITY
from tests.support.project_image import BASE_IMAGE, ensure_debian_base, image_exists, image_id

IMAGES = Path(__file__).parent / "images"
ROOTFS_SCRIPTS = IMAGES / "rootfs-resource"
GIT_SCRIPTS = IMAGES / "git-repo-resource"
MANIFEST = ROOTFS_SCRIPTS / "manifest"
# The fields of a manifest entry (see that script).
PATH, KIND, MODE, UID, GID, MTIME, SIZE, CONTENT, GROUP, XATTRS = range(10)
GIT_CONTAINERFILE = f"""\
FROM {BASE_IMAGE}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
COPY scripts/ /opt/resource/
"""


def rootfs_resource() -> str:
    ensure_debian_base()
    tag = _tag(ROOTFS_SCRIPTS, inspect.getsource(add_special_cases))
    ref = f"localhost/rf-rootfs-resource:{tag}"
    if image_exists(ref):
        return ref
    container = _run("buildah", "from", "--pull-never", BASE_IMAGE)
    try:
        root = Path(_run("buildah", "mount", container))
        shutil.copytree(ROOTFS_SCRIPTS, root / "opt/resource")
        add_special_cases(root)
        _run("buildah", "commit", "--quiet", container, ref)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def add_special_cases(root: Path) -> None:
    """What a Debian minbase lacks of what root filesystems hold. It has the rest: absolute
    links (/etc/alternatives/*, /etc/localtime, dangling), relative ones (/bin -> usr/bin),
    hard links (perl), setuid and setgid files, sticky /var/tmp, setgid /var/mail, files of
    group shadow, empty directories."""
    home = root / "home/user"
    home.mkdir(mode=0o700)
    (home / ".profile").write_text("export PS1='$ '\n")
    for path in (home, home / ".profile"):
        os.chown(path, 1000, 1000)
    cases = root / "srv/cases"
    cases.mkdir()
    ping = cases / "ping"
    shutil.copy2(root / "usr/bin/true", ping)
    os.setxattr(ping, "security.capability", NET_RAW_CAPABILITY)
    os.setxattr(ping, "user.comment", b"kept")
    os.link(ping, cases / "ping-hard-link")
    os.setxattr(cases, "user.binary", bytes(range(256)))
    os.symlink("../../../../../../etc/shadow", cases / "climbs-out")
    os.symlink("/proc/self/environ", cases / "environ")  # stored as a link, never read
    os.symlink("/no/such/target", cases / "dangling")
    (cases / "read-only").mkdir()
    (cases / "read-only/inside").write_text("in a read-only directory\n")
    (cases / "read-only").chmod(0o555)
    (cases / "empty").mkdir()
    os.chown(cases / "empty", 65534, 50)
    (cases / "empty").chmod(0o2750)


def git_repo_resource() -> str:
    return podman_image("rf-git-repo-resource", GIT_CONTAINERFILE, GIT_SCRIPTS, "scripts")


def podman_image(name: str, containerfile: str, scripts: Path, as_name: str) -> str:
    """``localhost/<name>:<tag>``, built by Podman from ``containerfile`` on the local Debian
    base with ``scripts`` in its context as ``as_name`` (reused while the tag, which hashes
    the base, the recipe and the scripts, is unchanged)."""
    ensure_debian_base()
    ref = f"localhost/{name}:{_tag(scripts, containerfile)}"
    if image_exists(ref):
        return ref
    with tempfile.TemporaryDirectory() as context:
        shutil.copytree(scripts, Path(context) / as_name)
        (Path(context) / "Containerfile").write_text(containerfile)
        _run("podman", "build", "--network=host", "--pull=never", "--tag", ref, context)
    return ref


def manifest(tree: Path, *tops: str) -> list[list[Any]]:
    """The manifest of ``tree`` (of its entries ``tops`` only, if given), as this machine
    sees it: the same script the rootfs resource runs on what it wrote."""
    return parse_manifest(_run("python3", str(MANIFEST), str(tree), *tops))


def parse_manifest(text: str) -> list[list[Any]]:
    return [json.loads(line) for line in text.splitlines()]


def image_manifest(ref: str, tops: list[str]) -> list[list[Any]]:
    """The manifest of image ``ref``'s entries ``tops``, read from Podman's mount of it."""
    root = _run("podman", "image", "mount", ref)
    try:
        return manifest(Path(root), *tops)
    finally:
        _run("podman", "image", "unmount", ref)


def mismatches(actual: list[list[Any]], expected: list[list[Any]]) -> list[str]:
    """Each path whose entry differs or is on one side only, with both entries: an empty list
    when the trees are equal (a readable failure where a diff of thousands would not be)."""
    left, right = ({entry[PATH]: entry for entry in side} for side in (actual, expected))
    return [
        f"{path}: {left.get(path)} != {right.get(path)}"
        for path in sorted(left.keys() | right.keys())
        if left.get(path) != right.get(path)
    ]


def unpack_artifact(store: Any, artifact: dict[str, str], into: Path) -> Path:
    """The reply's ``artifact`` unpacked into ``into``, its digest verified."""
    key = key_for_url(store, artifact["url"])
    assert key is not None, artifact["url"]
    with store.open(key) as stream:
        unpack(stream, into, format=format_for_key(key), expected_digest=artifact["digest"])
    return into


def _tag(scripts: Path, recipe: str) -> str:
    digest = hashlib.sha256(f"{image_id(BASE_IMAGE)}\0{recipe}\0".encode())
    for path in sorted(scripts.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout.strip()
