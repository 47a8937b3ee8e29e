"""Concourse's real ``registry-image`` and ``git`` resources (built from ../shared/third_party by
tests/support/real_resources.py) through the services on Podman, each step beside the same step
run bare (``podman run`` of the resource alone: tests/support/bare_steps.py).

registry-image, against ``crane registry serve`` on loopback holding the fidelity tests' root
filesystem image (absolute and climbing links, hard links, setuid/setgid/sticky, other owners,
a file capability, user xattrs: tests/support/fidelity_resources.py): check answers the
registry's digest; a ``format: rootfs`` and a ``format: oci`` get give artifacts that equal,
entry by entry (type, link target, mode, owner, size, sha256, hard-link group, kept xattrs),
what the bare ``in`` writes, and say what it says; a put of the oci ``image.tar`` pushes what
the bare ``out`` pushes.

git, against ``git daemon`` on loopback serving a repository with absolute and climbing links
committed (tests/support/git_server.py): check answers the branch's head; the get's clone
equals what the bare ``in`` writes, its links exactly as git stores them; a put of that clone
to another branch pushes what the bare ``out`` pushes.

Mtimes (and git's files that hold times of the run) are left out of the comparisons: these
resources stamp what they write with the time they write it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import open_store
from tests.support.bare_steps import bare, git_comparable, said_apart, without_mtimes
from tests.support.events import request_event, send
from tests.support.fidelity_resources import manifest, mismatches, rootfs_resource, unpack_artifact
from tests.support.git_server import LINKS, git, served_repository, working_tree_links
from tests.support.real_resources import crane, crane_registry
from tests.support.services import Services, running_services


@pytest.fixture(scope="module")
def services(
    docker_host: str,
    registry_image_resource: str,
    git_resource: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("real-resources")
    (tmp / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps(
            {"registry-image": registry_image_resource, "git": git_resource}
        ),
        "CONTAINER_NETWORK": "host",  # the registry and the git daemon listen on 127.0.0.1
        "CACHE_SECRET": "e2e-real-resources",
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
    }
    with running_services(env, tmp / "services.log") as services:
        yield services


@pytest.fixture(scope="module")
def image_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """registry-image's ``source`` for the rootfs image pushed to a registry on loopback."""
    log = tmp_path_factory.mktemp("registry") / "registry.log"
    with crane_registry("127.0.0.1", log) as registry:
        repository = f"{registry}/fidelity/rootfs"
        push = ["podman", "push", "--quiet", "--tls-verify=false"]
        subprocess.run([*push, rootfs_resource(), f"{repository}:latest"], check=True)
        yield {"repository": repository, "tag": "latest", "insecure": True}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    with served_repository(tmp_path_factory.mktemp("git-server")) as served:
        yield served


def ask(services: Services, action: str, data: dict[str, Any]) -> dict[str, Any]:
    status, reply, response = send(services.urls[action], request_event(action, data), timeout=600)
    assert status == 200, response.text
    assert reply.get_type().endswith(".succeeded"), reply.get_data()
    return dict(reply.get_data())


def digest_of(source: dict[str, Any]) -> str:
    argv = [crane(), "digest", "--insecure", f"{source['repository']}:{source['tag']}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def store_of(services: Services) -> Any:
    return open_store(services.env["STORE_URL"])


def latest_image(services: Services, source: dict[str, Any]) -> dict[str, Any]:
    reply = ask(services, "check", {"type": "registry-image", "source": source})
    return dict(reply["versions"][-1])


def retagged(answer: dict[str, Any], tag: str, as_tag: str) -> dict[str, Any]:
    return dict(json.loads(json.dumps(answer).replace(json.dumps(tag), json.dumps(as_tag))))


def test_registry_image_check_answers_the_registrys_digest(services, image_source):
    assert latest_image(services, image_source) == {
        "digest": digest_of(image_source),
        "tag": "latest",
    }


@pytest.mark.parametrize("form", ["rootfs", "oci"])
def test_registry_image_get_is_what_the_bare_in_writes(
    services, registry_image_resource, image_source, form, tmp_path
):
    version = latest_image(services, image_source)
    request = {"source": image_source, "version": version, "params": {"format": form}}
    got = ask(services, "get", {"type": "registry-image", **request})
    ours = unpack_artifact(store_of(services), got["artifact"], tmp_path / "ours")
    said = bare(registry_image_resource, "in", request, tmp_path / "bare")

    entries = manifest(ours)
    assert len(entries) > (7000 if form == "rootfs" else 3)
    assert mismatches(without_mtimes(entries), without_mtimes(manifest(tmp_path / "bare"))) == []
    assert said_apart(got, said) == []
    if form == "oci":
        assert (ours / "digest").read_text().strip() == version["digest"]


def test_registry_image_put_of_the_oci_tarball_pushes_what_the_bare_out_pushes(
    services, registry_image_resource, image_source, tmp_path
):
    version = latest_image(services, image_source)
    request = {"source": image_source, "version": version, "params": {"format": "oci"}}
    got = ask(services, "get", {"type": "registry-image", **request})
    params = {"image": "image/image.tar"}
    pushed = {**image_source, "tag": "pushed"}
    artifact = {key: got["artifact"][key] for key in ("url", "digest")}
    put = ask(
        services,
        "put",
        {
            "type": "registry-image",
            "source": pushed,
            "params": params,
            "inputs": {"image": artifact},
        },
    )

    inputs = tmp_path / "bare-put"
    unpack_artifact(store_of(services), got["artifact"], inputs / "image")
    bare_pushed = {**image_source, "tag": "bare-pushed"}
    said = bare(registry_image_resource, "out", {"source": bare_pushed, "params": params}, inputs)
    # Pushed again from image.tar, the manifest is not the one `podman push` wrote.
    assert digest_of(pushed) == digest_of(bare_pushed)
    # The two answers differ in the tag each was told to push, and only there.
    assert said_apart(put, retagged(said, "bare-pushed", "pushed")) == []
    assert latest_image(services, pushed) == {"digest": digest_of(pushed), "tag": "pushed"}


def test_git_check_answers_the_branchs_head(services, repository):
    uri, served = repository
    versions = ask(services, "check", {"type": "git", "source": {"uri": uri, "branch": "main"}})
    assert versions["versions"][-1] == {"ref": git("rev-parse", "main", cwd=served).strip()}


def git_get(services: Services, uri: str, served: Path, into: Path) -> tuple[dict, dict]:
    """The get of main's head through the services, unpacked into ``into``: (request, reply)."""
    head = {"ref": git("rev-parse", "main", cwd=served).strip()}
    request = {"source": {"uri": uri, "branch": "main"}, "version": head}
    got = ask(services, "get", {"type": "git", **request})
    unpack_artifact(store_of(services), got["artifact"], into)
    return request, got


def test_git_get_is_the_clone_the_bare_in_writes(services, git_resource, repository, tmp_path):
    uri, served = repository
    request, got = git_get(services, uri, served, tmp_path / "ours")
    said = bare(git_resource, "in", request, tmp_path / "bare")

    ours = tmp_path / "ours"
    entries = manifest(ours)
    assert mismatches(git_comparable(entries), git_comparable(manifest(tmp_path / "bare"))) == []
    assert said_apart(got, said) == []
    assert working_tree_links(ours) == LINKS
    assert git("status", "--porcelain", "--untracked-files=all", cwd=ours) == ""
    assert git("rev-parse", "HEAD", cwd=ours).strip() == request["version"]["ref"]


def test_git_put_of_the_clone_pushes_what_the_bare_out_pushes(
    services, git_resource, repository, tmp_path
):
    uri, served = repository
    request, got = git_get(services, uri, served, tmp_path / "clone")
    params = {"repository": "repo"}
    artifact = {key: got["artifact"][key] for key in ("url", "digest")}
    put = ask(
        services,
        "put",
        {
            "type": "git",
            "source": {"uri": uri, "branch": "pushed"},
            "params": params,
            "inputs": {"repo": artifact},
        },
    )

    inputs = tmp_path / "bare-put"
    shutil.copytree(tmp_path / "clone", inputs / "repo", symlinks=True)
    out = {"source": {"uri": uri, "branch": "bare-pushed"}, "params": params}
    said = bare(git_resource, "out", out, inputs)
    pushed, bare_pushed = (
        git("rev-parse", b, cwd=served).strip() for b in ("pushed", "bare-pushed")
    )
    assert pushed == bare_pushed == request["version"]["ref"]
    assert put["version"] == said["version"] == {"ref": pushed}
    assert said_apart(put, said) == []
