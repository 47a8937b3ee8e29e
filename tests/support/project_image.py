"""Build the project image (``Dockerfile``) with Podman on a machine that reaches no registry.

    build_project_image() -> "localhost/resource-functions:<hash>"

The base is a local Debian image, ``localhost/rf-debian-base:bookworm``, made once with
debootstrap (python3, python3-venv, ca-certificates) and ``podman import``. The project image's
tag is a hash of everything the build reads (Dockerfile, .dockerignore, requirements.txt, constraints.txt,
functions/, storage/) and of the base image's id, so an existing tag is reused as is: the
second call costs one ``podman image exists``. A file lock serialises concurrent callers.

Needs root (debootstrap) and Podman configured as in ENVIRONMENT.md; pip in the build reaches
PyPI through the host network (``--network=host``). Errors raise ``ImageBuildError`` with the
tail of the failing command's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/resource-functions"
BASE_IMAGE = "localhost/rf-debian-base:bookworm"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BUILD_INPUTS = (
    "Dockerfile",
    ".dockerignore",
    "requirements.txt",
    "constraints.txt",
    "functions",
    "storage",
    "agent",
)
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")  # CAs this machine adds to Debian's
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
BASE_CONFIG = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    # pip in a venv trusts its own certifi bundle, not the system's (which holds HOST_CA_DIR).
    f"ENV PIP_CERT=/{CA_BUNDLE}",
    'CMD ["/bin/bash"]',
)
BUILD_TIMEOUT = 1800.0  # seconds, for debootstrap and for podman build (pip downloads)


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message ends with the step's output."""


def build_project_image(repo: Path = REPO, base: str = BASE_IMAGE) -> str:
    """The project image's reference, built first if no image has its tag."""
    with build_lock("project-image"):
        ensure_debian_base(base)
        ref = f"{IMAGE}:{build_hash(repo, image_id(base))}"
        if not image_exists(ref):
            agent = build_agent(repo)
            _run(
                [
                    "podman",
                    "build",
                    "--network=host",
                    "--pull=never",
                    "--layers",
                    "--build-context",  # no registry for a Go image: the agent built here
                    f"agent={agent}",
                    "--build-arg",
                    f"BASE={base}",
                    "--tag",
                    ref,
                    "--file",
                    str(repo / "Dockerfile"),
                    str(repo),
                ]
            )
        return ref


def build_agent(repo: Path = REPO) -> Path:
    """A folder holding rf-agent alone (``agent/build.sh``), the image build's ``agent``."""
    folder = Path.home() / ".cache" / "resource-functions" / "agent-image"
    env = {**os.environ, "RF_BIN": str(folder)}
    built = _run(["bash", str(repo / "agent" / "build.sh")], env=env)
    return Path(built.strip().splitlines()[-1]).parent


def ensure_debian_base(ref: str = BASE_IMAGE) -> None:
    """Make ``ref`` (Debian minbase + BASE_PACKAGES) unless it exists."""
    if image_exists(ref):
        return
    if os.geteuid() != 0:
        raise ImageBuildError(f"{ref} does not exist, and debootstrap needs root to make it")
    _install_debootstrap()
    root = Path(tempfile.mkdtemp(prefix="rf-debian-base-", dir="/var/tmp"))
    try:
        mirror = os.environ.get("DEBIAN_MIRROR", DEFAULT_MIRROR)
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(root),
                mirror,
            ]
        )
        _trim(root)
        _trust_host_cas(root)
        _import(root, ref)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_hash(repo: Path, base_id: str) -> str:
    """12 hex digits naming the image built from ``repo``'s build inputs on ``base_id``."""
    digest = hashlib.sha256(base_id.encode() + b"\0")
    for path in _build_files(repo):
        rel = path.relative_to(repo).as_posix()
        executable = b"x" if os.access(path, os.X_OK) else b"-"
        digest.update(rel.encode() + b"\0" + executable + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def image_exists(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0


def _build_files(repo: Path) -> Iterator[Path]:
    for name in BUILD_INPUTS:
        top = repo / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path


def image_id(ref: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ImageBuildError(f"podman image inspect {ref}: {done.stderr.strip()}")
    return done.stdout.strip()


def _install_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "debootstrap"]
    if subprocess.run(install, check=False, capture_output=True, env=env).returncode != 0:
        _run(["apt-get", "update", "-qq"], env=env)  # a fresh machine has no package lists
        _run(install, env=env)


def _trim(root: Path) -> None:
    """Drop what a container never reads: downloaded packages, package lists, manuals."""
    for pattern in (
        "var/cache/apt/archives/*.deb",
        "var/cache/apt/*.bin",
        "var/lib/apt/lists/*",
        "usr/share/man/*",
        "usr/share/info/*",
    ):
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.name != "lock":
                path.unlink()


def _trust_host_cas(root: Path) -> None:
    """Append this machine's extra CAs (e.g. a TLS-intercepting egress proxy's) to the base's
    bundle, so pip in the build reaches PyPI the way the host does."""
    extra = sorted(HOST_CA_DIR.rglob("*.crt")) if HOST_CA_DIR.is_dir() else []
    if not extra:
        return
    with (root / CA_BUNDLE).open("a") as bundle:
        for cert in extra:
            bundle.write("\n" + cert.read_text().strip() + "\n")


def _import(root: Path, ref: str) -> None:
    changes = [arg for change in BASE_CONFIG for arg in ("--change", change)]
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
    )
    try:
        _run(["podman", "import", *changes, "-", ref], stdin=tar.stdout)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0:
            raise ImageBuildError(f"tar of {root} exited with status {tar.returncode}")


def _run(argv: list[str], **kwargs: object) -> str:
    with tempfile.TemporaryFile() as output:  # a file, not a pipe: builds print a lot
        try:
            done = subprocess.run(
                argv,
                check=False,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT,
                **kwargs,
            )  # type: ignore[call-overload]
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"{argv[0]} {argv[1]}: no result in {BUILD_TIMEOUT} s") from None
        output.seek(0)
        text = output.read().decode(errors="replace")
    if done.returncode != 0:
        raise ImageBuildError(
            f"{' '.join(argv[:2])} … exited with status {done.returncode}:\n{text[-4000:]}"
        )
    return text


def cache_dir() -> Path:
    """Where builds are cached (``~/.cache/resource-functions``), made if missing."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resource-functions"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """The file lock ``<cache>/<name>.lock`` for the block: one builder at a time, across
    processes (pytest-xdist workers, CI's setup and the tests)."""
    with (cache_dir() / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    print(build_project_image())
