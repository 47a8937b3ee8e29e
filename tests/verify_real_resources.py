"""By hand, where their sources are at hand: Concourse's real ``registry-image`` and ``git``
resources through the services on Podman, each step beside the same step run bare (``podman
run`` of the resource alone, no services).

CI cannot run this: the Go module proxy refuses ``github.com/concourse/registry-image-resource``
and ``github.com/concourse/git-resource`` (403), and no other source of them is reachable from CI
(issue 19). Given checkouts of them:

- ``--registry-image DIR``: its ``check``, ``in`` and ``out`` built statically (``CGO_ENABLED=0``,
  as its Dockerfile does) into an image on the local Debian base; the fidelity tests' root
  filesystem image (absolute and climbing links, hard links, setuid/setgid/sticky, other
  owners, a file capability, user xattrs: ``tests/support/fidelity_resources.py``) pushed into
  ``crane registry serve`` on loopback. Check answers the registry's digest; a ``format:
  rootfs`` and a ``format: oci`` get give artifacts that equal, entry by entry (type, link
  target, mode, owner, size, sha256, hard-link group, kept xattrs), what the bare ``in``
  writes; a put of the oci ``image.tar`` pushes what the bare ``out`` pushes.
- ``--git DIR``: its ``assets/`` on the Debian base with the packages its Dockerfile adds; a
  repository with absolute and climbing links committed, served by ``git daemon`` on
  loopback. Check answers the branch's head; the get's clone equals what the bare ``in``
  writes, its links exactly as git stores them, its metadata the same; a put of that clone
  to another branch pushes what the bare ``out`` pushes.

Mtimes are left out of the comparisons: these resources stamp what they write with the time
they write it, so two runs differ there (``tests/e2e/test_rootfs_round_trip.py`` shows that
artifacts keep mtimes exactly). It also prints how the rootfs differs from the image as Podman
stores it (what the resource itself keeps or drops). Exit status 1 on any failed check.

    python3 -m tests.verify_real_resources --registry-image ~/src/registry-image-resource \
        --git ~/src/git-resource
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from functions.cli.launch import free_port
from storage import open_store
from testbed.podman import podman_service
from testbed.process import running
from tests.support.events import request_event, send
from tests.support.fidelity_resources import (
    MTIME,
    PATH,
    image_manifest,
    manifest,
    mismatches,
    podman_image,
    rootfs_resource,
    unpack_artifact,
)
from tests.support.git_server import LINKS, git, served_repository
from tests.support.project_image import BASE_IMAGE, ensure_debian_base
from tests.support.services import Services, start_services

CRANE = "github.com/google/go-containerregistry/cmd/crane@v0.22.1"
CACHE = Path.home() / ".cache/resource-functions"


def run(*argv: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr.decode()}")
    return done.stdout.decode().strip()


def crane() -> str:
    binary = CACHE / "crane-v0.22.1/bin/crane"
    if not binary.exists():
        env = {**os.environ, "CGO_ENABLED": "0", "GOBIN": str(binary.parent)}
        subprocess.run(["go", "install", CRANE], env=env, check=True)
    return str(binary)


def registry_image_resource(source: Path, work: Path) -> str:
    """The resource's three commands, built statically, in /opt/resource of the Debian base."""
    built = work / "resource"
    env = {**os.environ, "CGO_ENABLED": "0"}
    for command in ("check", "in", "out"):
        subprocess.run(
            ["go", "build", "-o", str(built / command), f"./cmd/{command}"],
            cwd=source,
            env=env,
            check=True,
        )
    digest = hashlib.sha256(b"".join((built / c).read_bytes() for c in ("check", "in", "out")))
    ref = f"localhost/rf-registry-image-resource:{digest.hexdigest()[:12]}"
    ensure_debian_base()
    container = run("buildah", "from", "--pull-never", BASE_IMAGE)
    try:
        run("buildah", "copy", container, str(built), "/opt/resource/")
        run("buildah", "commit", "--quiet", container, ref)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def bare(image: str, command: str, request: dict[str, Any], directory: Path) -> str:
    """The resource's ``command`` run by Podman alone on ``directory`` (its stdout)."""
    directory.mkdir(exist_ok=True)
    return run(
        "podman", "run", "--rm", "-i", "--network=host", "-v", f"{directory}:/tmp/build/dir",
        image, f"/opt/resource/{command}", "/tmp/build/dir",
        stdin=json.dumps(request).encode(),
    )  # fmt: skip


def without_mtimes(entries: list[list[Any]]) -> list[list[Any]]:
    """The resource stamps what it writes with the time it writes it: two runs differ there."""
    return [[*entry[:MTIME], None, *entry[MTIME + 1 :]] for entry in entries]


class Checks:
    """What was checked: printed as it goes, the failed ones kept."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def expect(self, what: str, differences: list[str]) -> None:
        self._say("ok" if not differences else "FAILED", what, differences)
        if differences:
            self.failed.append(what)

    def inform(self, what: str, lines: list[str]) -> None:
        self._say("info", what, lines)

    @staticmethod
    def _say(verdict: str, what: str, lines: list[str]) -> None:
        print(f"{verdict:8}{what}")
        for line in lines[:20]:
            print(" " * 8 + line[:400])


def git_resource(source: Path) -> str:
    """The resource's ``assets/`` on the Debian base, with the packages and git settings its
    Dockerfile adds (but proxytunnel, which nothing here uses)."""
    recipe = f"""\
FROM {BASE_IMAGE}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
    bash ca-certificates coreutils git git-lfs gnupg jq openssh-client >/dev/null \\
 && rm -rf /var/lib/apt/lists/* \\
 && git config --global user.email git@localhost && git config --global user.name git \\
 && git config --global pull.rebase false && git config --global protocol.file.allow always
COPY assets/ /opt/resource/
RUN chmod +x /opt/resource/*
"""
    return podman_image("rf-real-git-resource", recipe, source / "assets", "assets")


@contextmanager
def running_podman(socket: Path, log: Path) -> Iterator[None]:
    """A Podman API service of our own on ``socket`` for the block."""
    process = podman_service(socket, log)
    try:
        yield
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def services_for(kind: str, image: str, socket: Path, work: Path) -> Iterator[Services]:
    """The three services, with resource type ``kind`` running ``image`` on the host's
    network (the registry and the git daemon listen on 127.0.0.1)."""
    (work / "store").mkdir(parents=True)
    env = {
        "DOCKER_HOST": f"unix://{socket}",
        "RESOURCE_TYPES": json.dumps({kind: image}),
        "CONTAINER_NETWORK": "host",
        "CACHE_SECRET": "verify-real-resources",
        "STORE_URL": (work / "store").as_uri(),
        "WORK_DIR": str(work),
    }
    services = start_services(env, work / "services.log")
    try:
        yield services
    finally:
        services.stop()


def ask(services: Services, action: str, data: dict[str, Any]) -> dict[str, Any]:
    """A request's reply data; exits on anything but a success."""
    status, reply, response = send(services.urls[action], request_event(action, data), timeout=600)
    if status != 200 or reply is None or not reply.get_type().endswith(".succeeded"):
        raise SystemExit(f"{action}: {status} {response.text[:2000]}")
    return dict(reply.get_data())


def said_apart(got: dict[str, Any], said: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Where the reply's version and metadata differ from what the bare step printed."""
    pairs = [(got["version"], said["version"])]
    pairs += list(zip(got["metadata"], said["metadata"], strict=False))
    pairs.append((len(got["metadata"]), len(said["metadata"])))
    return [(ours, theirs) for ours, theirs in pairs if ours != theirs]


def verify_registry_image(source: Path, work: Path, socket: Path, checks: Checks) -> None:
    resource = registry_image_resource(source, work)
    tested = rootfs_resource()
    registry = f"127.0.0.1:{free_port()}"
    serve = [crane(), "registry", "serve", "--address", registry]
    with (
        running("registry", serve, f"http://{registry}/v2/", work / "registry.log"),
        services_for("registry-image", resource, socket, work) as services,
    ):
        repository = f"{registry}/fidelity/rootfs"
        run("podman", "push", "--quiet", "--tls-verify=false", tested, f"{repository}:latest")
        store = open_store(services.env["STORE_URL"])

        def digest_of(tag: str) -> str:
            return run(crane(), "digest", "--insecure", f"{repository}:{tag}")

        source_ = {"repository": repository, "tag": "latest", "insecure": True}
        digest = digest_of("latest")
        versions = ask(services, "check", {"type": "registry-image", "source": source_})
        version = versions["versions"][-1]
        checks.expect(
            f"registry-image: check answers the registry's digest {digest}",
            [] if version.get("digest") == digest else [str(versions)],
        )
        trees, artifacts = {}, {}
        for form in ("rootfs", "oci"):
            request = {"source": source_, "version": version, "params": {"format": form}}
            got = ask(services, "get", {"type": "registry-image", **request})
            artifacts[form] = got["artifact"]
            ours = unpack_artifact(store, artifacts[form], work / f"ours-{form}")
            alone = work / f"bare-{form}"
            said = json.loads(bare(resource, "in", request, alone))
            entries = manifest(ours)
            checks.expect(
                f"registry-image: the {form} get's artifact is what the bare `in` writes "
                f"({len(entries)} entries)",
                mismatches(without_mtimes(entries), without_mtimes(manifest(alone))),
            )
            checks.expect(
                f"registry-image: the {form} get's version and metadata are what the bare "
                "`in` says",
                [f"{a}: {b}" for a, b in said_apart(got, said)],
            )
            trees[form] = ours
        written = (trees["oci"] / "digest").read_text().strip()
        checks.expect(
            "registry-image: the oci get's digest file is the registry's digest",
            [] if written == digest else [written],
        )
        tops = sorted(os.listdir(trees["rootfs"] / "rootfs"))
        image = without_mtimes(image_manifest(tested, tops))
        differ = mismatches(without_mtimes(manifest(trees["rootfs"] / "rootfs")), image)
        checks.inform(
            f"registry-image: the rootfs against the image as Podman stores it: {len(differ)} "
            "entries differ (the resource's own choices)",
            differ,
        )
        params = {"image": "image/image.tar"}
        oci = {"url": artifacts["oci"]["url"], "digest": artifacts["oci"]["digest"]}
        pushed = {**source_, "tag": "pushed"}
        put = {
            "type": "registry-image",
            "source": pushed,
            "params": params,
            "inputs": {"image": oci},
        }
        ask(services, "put", put)
        inputs = work / "bare-put"
        shutil.copytree(trees["oci"], inputs / "image", symlinks=True)
        bare(
            resource, "out", {"source": {**source_, "tag": "bare-pushed"}, "params": params}, inputs
        )
        again = ask(services, "check", {"type": "registry-image", "source": pushed})["versions"]
        expected = digest_of("bare-pushed")
        checks.expect(
            "registry-image: a put of the oci image.tar pushes what the bare `out` pushes "
            f"({expected})",
            [] if again[-1].get("digest") == expected == digest_of("pushed") else [str(again)],
        )


# Git's files in a clone that hold times of the run (the index keeps each file's ctime).
GIT_TIMED = (".git/index", ".git/FETCH_HEAD", ".git/ORIG_HEAD", ".git/logs/")


def comparable(entries: list[list[Any]]) -> list[list[Any]]:
    """A clone's entries but for git's files that hold times of the run."""
    return without_mtimes([entry for entry in entries if not entry[PATH].startswith(GIT_TIMED)])


def links_in(tree: Path) -> dict[str, str]:
    return {
        path.relative_to(tree).as_posix(): os.readlink(path)
        for path in sorted(tree.rglob("*"))
        if path.is_symlink() and ".git" not in path.relative_to(tree).parts
    }


def verify_git(source: Path, work: Path, socket: Path, checks: Checks) -> None:
    resource = git_resource(source)
    with (
        served_repository(work / "server") as (uri, served),
        services_for("git", resource, socket, work) as services,
    ):
        store = open_store(services.env["STORE_URL"])
        main = {"uri": uri, "branch": "main"}
        head = git("rev-parse", "main", cwd=served).strip()
        versions = ask(services, "check", {"type": "git", "source": main})["versions"]
        checks.expect(
            f"git: check answers the branch's head {head}",
            [] if versions[-1] == {"ref": head} else [str(versions)],
        )
        request = {"source": main, "version": versions[-1]}
        got = ask(services, "get", {"type": "git", **request})
        ours = unpack_artifact(store, got["artifact"], work / "ours-get")
        alone = work / "bare-get"
        said = json.loads(bare(resource, "in", request, alone))
        entries = manifest(ours)
        checks.expect(
            f"git: the get's clone is what the bare `in` writes ({len(entries)} entries)",
            mismatches(comparable(entries), comparable(manifest(alone))),
        )
        checks.expect(
            "git: the get's version and metadata are what the bare `in` says",
            [f"{a}: {b}" for a, b in said_apart(got, said)],
        )
        checks.expect(
            "git: the clone's links are as committed",
            [] if links_in(ours) == LINKS else [str(links_in(ours))],
        )
        status = git("status", "--porcelain", "--untracked-files=all", cwd=ours)
        checks.expect(
            "git: `git status` finds the clone equal to its commit", [status] if status else []
        )
        artifact = {"url": got["artifact"]["url"], "digest": got["artifact"]["digest"]}
        params = {"repository": "repo"}
        put = {
            "type": "git",
            "source": {**main, "branch": "pushed"},
            "params": params,
            "inputs": {"repo": artifact},
        }
        put_version = ask(services, "put", put)["version"]
        inputs = work / "bare-put"
        shutil.copytree(ours, inputs / "repo", symlinks=True)
        bare(
            resource, "out", {"source": {**main, "branch": "bare-pushed"}, "params": params}, inputs
        )
        pushed, bare_pushed = (
            git("rev-parse", b, cwd=served).strip() for b in ("pushed", "bare-pushed")
        )
        checks.expect(
            f"git: a put of the clone pushes what the bare `out` pushes ({bare_pushed})",
            []
            if put_version == {"ref": pushed} and pushed == bare_pushed == head
            else [f"{put_version} {pushed} {bare_pushed}"],
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry-image", type=Path, help="a registry-image-resource checkout")
    parser.add_argument("--git", type=Path, help="a git-resource checkout")
    args = parser.parse_args()
    if not args.registry_image and not args.git:
        parser.error("give --registry-image DIR, --git DIR or both")
    work = Path(tempfile.mkdtemp(prefix="rf-real-resources-"))
    checks = Checks()
    with running_podman(work / "podman.sock", work / "podman.log"):
        if args.registry_image:
            verify_registry_image(
                args.registry_image.resolve(), work / "registry-image", work / "podman.sock", checks
            )
        if args.git:
            verify_git(args.git.resolve(), work / "git", work / "podman.sock", checks)
    if checks.failed:  # an exit on the way leaves it too: its logs say why
        print(f"what the runs wrote, and their logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("FAILED: " + ", ".join(checks.failed) if checks.failed else "all checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
