"""By hand, where its source is at hand: Concourse's real ``registry-image`` resource through
the services on Podman, against a real registry (``crane registry serve``) on loopback.

CI cannot run this: the Go module proxy refuses ``github.com/concourse/registry-image-resource``
(403) and no other source of it is reachable from CI (issue 19). Given a checkout of it, this
builds its ``check``, ``in`` and ``out`` statically (``CGO_ENABLED=0``, as its Dockerfile does) into
an image on the local Debian base, pushes the fidelity tests' root filesystem image (absolute
and climbing links, hard links, setuid/setgid/sticky, other owners, a file capability, user
xattrs: ``tests/fidelity_resources.py``) into the registry, and checks, each against the same
resource run bare (``podman run`` of its ``in``, no services):

- check answers the digest the registry has;
- a ``format: rootfs`` get and a ``format: oci`` get give artifacts whose unpacked trees equal,
  entry by entry (type, link target, mode, owner, mtime, size, sha256, hard-link group, kept
  xattrs), what the bare ``in`` writes; the oci ``digest`` file is the registry's digest;
- a put of that oci get's ``image.tar`` pushes a tag whose check answers the same digest.

It also prints how the rootfs differs from the image as Podman stores it (what the resource
itself keeps or drops: not the services'). Exit status 1 on any failed check.

    python3 testbed/verify_registry_image.py --source ~/src/registry-image-resource
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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage import open_store
from testbed.process import free_port, running
from tests.e2e.conftest import start_services
from tests.e2e.events import request_event, send
from tests.fidelity_resources import (
    MTIME,
    image_manifest,
    manifest,
    mismatches,
    rootfs_resource,
    unpack_artifact,
)
from tests.project_image import BASE_IMAGE, ensure_debian_base

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


def resource_image(source: Path, work: Path) -> str:
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
    def __init__(self) -> None:
        self.failed: list[str] = []

    def expect(self, what: str, differences: list[str]) -> None:
        print(("ok      " if not differences else "FAILED  ") + what)
        for line in differences[:20]:
            print("        " + line)
        if differences:
            self.failed.append(what)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="registry-image-resource")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rf-registry-image-"))
    try:
        return verify(args.source.resolve(), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verify(source: Path, work: Path) -> int:
    resource = resource_image(source, work)
    tested = rootfs_resource()
    port = free_port()
    registry = f"127.0.0.1:{port}"
    serve = [crane(), "registry", "serve", "--address", registry]
    socket = work / "podman.sock"
    with (
        running("registry", serve, f"http://{registry}/v2/", work / "registry.log"),
        running_podman(socket, work / "podman.log"),
    ):
        repository = f"{registry}/fidelity/rootfs"
        run("podman", "push", "--quiet", "--tls-verify=false", tested, f"{repository}:latest")
        (work / "store").mkdir()
        services = start_services(
            {
                "DOCKER_HOST": f"unix://{socket}",
                "RESOURCE_TYPES": json.dumps({"registry-image": resource}),
                "CONTAINER_NETWORK": "host",  # the registry is on 127.0.0.1
                "CACHE_SECRET": "verify-registry-image",
                "STORE_URL": (work / "store").as_uri(),
                "WORK_DIR": str(work),
            },
            work / "services.log",
        )
        try:
            return compare(services, resource, tested, repository, work)
        finally:
            services.stop()


@contextmanager
def running_podman(socket: Path, log: Path) -> Iterator[None]:
    """A Podman API service of our own on ``socket`` for the block."""
    command = ["podman", "system", "service", "--time=0", f"unix://{socket}"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not socket.exists():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit(f"podman system service did not start: {log}")
                time.sleep(0.1)
            yield
        finally:
            process.terminate()
            process.wait(10)


def compare(services: Any, resource: str, tested: str, repository: str, work: Path) -> int:
    checks = Checks()
    store = open_store(services.env["STORE_URL"])

    def ask(action: str, data: dict[str, Any]) -> dict[str, Any]:
        event = request_event(action, {"type": "registry-image", **data})
        status, reply, response = send(services.urls[action], event, timeout=600)
        if status != 200 or reply is None or not reply.get_type().endswith(".succeeded"):
            raise SystemExit(f"{action}: {status} {response.text[:2000]}")
        return dict(reply.get_data())

    def digest_of(tag: str) -> str:
        return run(crane(), "digest", "--insecure", f"{repository}:{tag}")

    source = {"repository": repository, "tag": "latest", "insecure": True}
    digest = digest_of("latest")
    versions = ask("check", {"source": source})["versions"]
    checks.expect(
        f"check answers the registry's digest {digest}",
        [] if versions[-1].get("digest") == digest else [str(versions)],
    )
    version = versions[-1]
    trees, artifacts = {}, {}
    for form in ("rootfs", "oci"):
        request = {"source": source, "version": version, "params": {"format": form}}
        artifacts[form] = ask("get", request)["artifact"]
        ours = unpack_artifact(store, artifacts[form], work / f"ours-{form}")
        alone = work / f"bare-{form}"
        bare(resource, "in", request, alone)
        entries = manifest(ours)
        checks.expect(
            f"the {form} get's artifact is what the bare `in` writes, but for mtimes "
            f"({len(entries)} entries)",
            mismatches(without_mtimes(entries), without_mtimes(manifest(alone))),
        )
        trees[form] = ours
    written = (trees["oci"] / "digest").read_text().strip()
    checks.expect(
        "the oci get's digest file is the registry's digest", [] if written == digest else [written]
    )
    tops = sorted(os.listdir(trees["rootfs"] / "rootfs"))
    image = without_mtimes(image_manifest(tested, tops))
    differ = mismatches(without_mtimes(manifest(trees["rootfs"] / "rootfs")), image)
    print(
        f"info    the rootfs against the image as Podman stores it, but for mtimes: {len(differ)} entries differ (the resource's own choices)"
    )
    for line in differ[:20]:
        print("        " + line)
    put = {"params": {"image": "image/image.tar"}}
    oci = {"url": artifacts["oci"]["url"], "digest": artifacts["oci"]["digest"]}
    ask("put", {"source": {**source, "tag": "pushed"}, "inputs": {"image": oci}, **put})
    inputs = work / "bare-put"
    shutil.copytree(trees["oci"], inputs / "image", symlinks=True)
    bare(resource, "out", {"source": {**source, "tag": "bare-pushed"}, **put}, inputs)
    again = ask("check", {"source": {**source, "tag": "pushed"}})["versions"]
    expected = digest_of("bare-pushed")
    checks.expect(
        f"a put of the oci image.tar pushes what the bare `out` pushes ({expected}; the image got: {digest})",
        [] if again[-1].get("digest") == expected == digest_of("pushed") else [str(again)],
    )
    print("FAILED: " + ", ".join(checks.failed) if checks.failed else "all checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
