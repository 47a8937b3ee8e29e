"""Concourse's real ``registry-image`` and ``git`` resources, as images built here from their
source tarballs in ``../shared/third_party`` (its README says what each is), and ``crane``.

    registry_image_resource_image() -> "localhost/rf-registry-image-resource:<tag>"
        its ``check``, ``in`` and ``out`` built statically (``CGO_ENABLED=0``, Go modules from
        the module proxy), as its Dockerfile does, in ``/opt/resource`` of the local Debian
        base with the packages that Dockerfile adds (tzdata, unzip, zip)
    git_resource_image() -> "localhost/rf-git-resource:<tag>"
        its ``assets/`` in ``/opt/resource`` of the local Debian base with the packages and
        git settings its Dockerfile adds (not proxytunnel, which it builds from a clone of
        another repository and nothing here uses)
    registry_image_resource_ref(), git_resource_ref() -> the references the two would have,
        without building them (for a catalogue that names them before any test needs them)
    crane() -> the path of ``crane`` (go-containerregistry), ``go install``-ed once per version
    crane_registry(host, log) -> "HOST:PORT" of ``crane registry serve`` (plain HTTP, in
        memory) for the block

A tag hashes the tarball's sha256 (checked against the one pinned here), the recipe and the
base image's id: an image with its tag is reused as is, so a second call costs a ``podman image
exists``. A file lock per image serialises concurrent builders (pytest-xdist workers, CI's
setup and the tests). ``python3 -m tests.support.real_resources`` builds all three and prints
what each cost (``.ci/setup --tests`` runs it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from functions.cli.launch import free_port
from testbed.process import running
from tests.support.project_image import (
    BASE_IMAGE,
    REPO,
    ImageBuildError,
    _run,
    build_lock,
    cache_dir,
    ensure_debian_base,
    image_exists,
    image_id,
)

CRANE_VERSION = "v0.22.1"
CRANE_MODULE = "github.com/google/go-containerregistry/cmd/crane"


@dataclass(frozen=True)
class Source:
    """A resource's source tarball and the image built from it."""

    image: str  # localhost/<image>:<tag>
    tarball: str  # in ../shared/third_party
    sha256: str  # the tarball's, as its README lists it

    @property
    def path(self) -> Path:
        return third_party() / self.tarball


REGISTRY_IMAGE = Source(
    "rf-registry-image-resource",
    "registry-image-resource-b25996c.tar.xz",
    "96678b05094f57d77c81ac84704602d2e4708d01880beece2fe744378c945b6a",
)
GIT = Source(
    "rf-git-resource",
    "git-resource-03fd6d3.tar.xz",
    "d41270429b8c896593a4fd90aae624b9c4fb5bcf88c799a3b226fcc642ecd640",
)

REGISTRY_IMAGE_RECIPE = f"""\
FROM {BASE_IMAGE}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
    ca-certificates tzdata unzip zip >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
COPY resource/ /opt/resource/
RUN chmod +x /opt/resource/*
"""
GIT_RECIPE = f"""\
FROM {BASE_IMAGE}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
    bash ca-certificates coreutils git git-crypt git-lfs gnupg jq openssh-client >/dev/null \\
 && rm -rf /var/lib/apt/lists/* \\
 && git config --global user.email git@localhost && git config --global user.name git \\
 && git config --global pull.rebase false && git config --global protocol.file.allow always \\
 && git config --global http.version HTTP/2
COPY resource/ /opt/resource/
RUN chmod +x /opt/resource/*
"""
GO_ENV = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}


def third_party() -> Path:
    """``RF_THIRD_PARTY``, or ``../shared/third_party`` beside the checkout."""
    return Path(os.environ.get("RF_THIRD_PARTY") or REPO.parent / "shared/third_party")


def registry_image_resource_image() -> str:
    return _image(REGISTRY_IMAGE, REGISTRY_IMAGE_RECIPE, _built_commands)


def git_resource_image() -> str:
    return _image(GIT, GIT_RECIPE, _assets)


def registry_image_resource_ref() -> str:
    return _ref(REGISTRY_IMAGE, REGISTRY_IMAGE_RECIPE)


def git_resource_ref() -> str:
    return _ref(GIT, GIT_RECIPE)


def crane() -> str:
    binary = cache_dir() / f"crane-{CRANE_VERSION}/bin/crane"
    with build_lock("crane"):
        if not binary.exists():
            env = {**os.environ, **GO_ENV, "GOBIN": str(binary.parent)}
            _run(["go", "install", f"{CRANE_MODULE}@{CRANE_VERSION}"], env=env)
    return str(binary)


@contextmanager
def crane_registry(host: str, log: Path) -> Iterator[str]:
    address = f"{host}:{free_port(host)}"
    serve = [crane(), "registry", "serve", "--address", address]
    with running("crane registry", serve, f"http://{address}/v2/", log):
        yield address


def _image(source: Source, recipe: str, resource: Callable[[Path, Path], None]) -> str:
    """``localhost/<source.image>:<tag>``, built by Podman from ``recipe`` with
    ``resource(unpacked, into)`` (what goes in ``/opt/resource``) as ``resource/`` in its
    context, unless an image has its tag."""
    with build_lock(source.image):
        ensure_debian_base()
        ref = _ref(source, recipe)
        if image_exists(ref):
            return ref
        with tempfile.TemporaryDirectory(prefix=f"{source.image}-", dir="/var/tmp") as work:
            unpacked, context = Path(work) / "src", Path(work) / "context"
            unpacked.mkdir()
            (context / "resource").mkdir(parents=True)
            _run(["tar", "-xJf", str(source.path), "-C", str(unpacked), "--strip-components=1"])
            resource(unpacked, context / "resource")
            (context / "Containerfile").write_text(recipe)
            _run(["podman", "build", "--network=host", "--pull=never", "--tag", ref, str(context)])
        return ref


def _ref(source: Source, recipe: str) -> str:
    """The tag hashes the tarball's (verified) sha256, the recipe and the base image's id."""
    seed = f"{_verified_sha256(source)}\0{recipe}\0{image_id(BASE_IMAGE)}"
    return f"localhost/{source.image}:{hashlib.sha256(seed.encode()).hexdigest()[:12]}"


def _verified_sha256(source: Source) -> str:
    if not source.path.is_file():
        raise ImageBuildError(f"{source.path} is missing (see ../shared/third_party/README.md)")
    digest = hashlib.sha256()
    with source.path.open("rb") as tarball:
        for block in iter(lambda: tarball.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != source.sha256:
        raise ImageBuildError(
            f"{source.path}: sha256 {digest.hexdigest()}, expected {source.sha256}"
        )
    return source.sha256


def _built_commands(unpacked: Path, into: Path) -> None:
    """registry-image's three commands, static, as its Dockerfile builds them."""
    env = {**os.environ, **GO_ENV}
    commands = ("./cmd/check", "./cmd/in", "./cmd/out")
    _run(["go", "build", "-o", f"{into}/", *commands], cwd=unpacked, env=env)


def _assets(unpacked: Path, into: Path) -> None:
    """git-resource's scripts, as its Dockerfile adds them."""
    _run(["cp", "-a", f"{unpacked}/assets/.", str(into)])


if __name__ == "__main__":
    for name, build in (
        ("crane", crane),
        ("registry-image", registry_image_resource_image),
        ("git", git_resource_image),
    ):
        start = time.monotonic()
        built = build()
        print(f"{name}: {built} ({time.monotonic() - start:.0f} s)", flush=True)
