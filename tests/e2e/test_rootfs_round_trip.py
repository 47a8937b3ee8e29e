"""A root filesystem through the real services on Podman, byte-exact. The resource is our own
(tests/support/images/rootfs-resource, the local Debian base and a few special cases): its ``in``
copies its image's own root filesystem into the get's output with ``cp -a`` and takes a
manifest of what it wrote, in its container. The artifact, unpacked, equals entry by entry
(type, link target, mode, owner, mtime, size, sha256, hard-link group, kept xattrs):

- the tree as the resource wrote it (that manifest, whose digest the get's metadata carries);
- the image's filesystem as Podman stores it (``podman image mount``), but for what the
  runtime makes in a container's /etc;

and a put given that artifact as input sees the same tree (its ``out`` checks it against the
manifest and names the manifest's digest as the version).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from storage import open_store
from storage.archive import format_for_key
from storage.base import key_for_url
from tests.support.fidelity_resources import (
    CONTENT,
    GID,
    GROUP,
    KIND,
    MODE,
    MTIME,
    PATH,
    UID,
    XATTRS,
    image_manifest,
    manifest,
    mismatches,
    parse_manifest,
    rootfs_resource,
    unpack_artifact,
)
from tests.support.round_trip import put_input, succeeded
from tests.support.services import Services, running_services

CACHE_SECRET = "e2e-rootfs-cache-secret"
VERSION = {"tree": "root"}
# What Podman makes in a container's /etc (mount points and their contents): not the image's.
RUNTIME_FILES = {"etc/hostname", "etc/hosts", "etc/mtab", "etc/resolv.conf"}


@pytest.fixture(scope="module")
def image() -> str:
    return rootfs_resource()


@pytest.fixture(scope="module")
def services(
    docker_host: str, image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("rootfs")
    (tmp / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps({"rootfs": image}),
        "CONTAINER_NETWORK": "none",
        "CACHE_SECRET": CACHE_SECRET,
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
    }
    with running_services(env, tmp / "services.log") as services:
        yield services


@pytest.fixture(scope="module")
def got(services: Services) -> dict[str, Any]:
    return succeeded(services.urls, "get", {"type": "rootfs", "source": {}, "version": VERSION})


@pytest.fixture(scope="module")
def tree(services: Services, got: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = open_store(services.env["STORE_URL"])
    return unpack_artifact(store, got["artifact"], tmp_path_factory.mktemp("artifact"))


def metadata(reply: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in reply["metadata"]}


def test_the_artifact_is_the_tree_the_resource_wrote_entry_by_entry(got, tree):
    written = (tree / "manifest.jsonl").read_bytes()
    assert hashlib.sha256(written).hexdigest() == metadata(got)["manifest_sha256"]
    expected = parse_manifest(written.decode())
    assert len(expected) == int(metadata(got)["entries"]) > 7000
    assert mismatches(manifest(tree / "rootfs"), expected) == []


def mode_and_owner(entry: list[Any]) -> tuple[str, int, int]:
    return entry[MODE], entry[UID], entry[GID]


def test_the_artifact_holds_what_root_filesystems_hold(tree):
    entries = {entry[PATH]: entry for entry in manifest(tree / "rootfs")}
    assert entries["etc/localtime"][CONTENT] == "/usr/share/zoneinfo/Etc/UTC"
    assert entries["etc/alternatives/awk"][CONTENT] == "/usr/bin/mawk"
    assert entries["bin"][KIND] == "l" and entries["bin"][CONTENT] == "usr/bin"
    assert entries["srv/cases/climbs-out"][CONTENT] == "../../../../../../etc/shadow"
    assert entries["srv/cases/environ"][CONTENT] == "/proc/self/environ"
    assert entries["usr/bin/su"][MODE] == "4755"
    assert mode_and_owner(entries["usr/bin/chage"]) == ("2755", 0, 42)  # setgid, group shadow
    assert entries["var/tmp"][MODE] == "1777"
    assert mode_and_owner(entries["var/mail"]) == ("2775", 0, 8)
    assert mode_and_owner(entries["srv/cases/empty"]) == ("2750", 65534, 50)
    assert entries["srv/cases/read-only"][MODE] == "555"
    assert mode_and_owner(entries["home/user"]) == ("700", 1000, 1000)
    assert entries["usr/bin/perl5.36.0"][GROUP] == "usr/bin/perl"
    assert entries["srv/cases/ping-hard-link"][GROUP] == "srv/cases/ping"
    assert entries["srv/cases/ping"][XATTRS] == {
        "security.capability": "0100000200200000000000000000000000000000",
        "user.comment": b"kept".hex(),
    }
    assert entries["srv/cases"][XATTRS] == {"user.binary": bytes(range(256)).hex()}
    assert os.readlink(tree / "rootfs/srv/cases/environ") == "/proc/self/environ"


def test_the_artifact_is_the_image_root_filesystem(image, tree):
    tops = sorted(os.listdir(tree / "rootfs"))
    unpacked = without_runtime_files(manifest(tree / "rootfs"))
    assert mismatches(unpacked, without_runtime_files(image_manifest(image, tops))) == []


def without_runtime_files(entries: list[list[Any]]) -> list[list[Any]]:
    """``entries`` without what the container runtime adds to /etc, and /etc's mtime (which
    adding them changes)."""
    kept = [entry for entry in entries if entry[PATH] not in RUNTIME_FILES]
    return [[*e[:MTIME], None, *e[MTIME + 1 :]] if e[PATH] == "etc" else e for e in kept]


def test_packing_read_nothing_through_the_links(services, got):
    store = open_store(services.env["STORE_URL"])
    key = key_for_url(store, got["artifact"]["url"])
    assert key is not None and format_for_key(key) == "zstd"
    with store.open(key) as stream:
        tar = zstandard.ZstdDecompressor().stream_reader(stream).read()
    assert CACHE_SECRET.encode() not in tar  # in the packing process's /proc/self/environ


def test_a_put_given_the_artifact_sees_the_same_tree(services, got):
    artifact = got["artifact"]
    put = succeeded(
        services.urls,
        "put",
        {
            "type": "rootfs",
            "source": {},
            "params": {"input": "rootfs"},
            "inputs": {"rootfs": put_input(artifact)},
        },
    )
    assert put["version"] == {"manifest_sha256": metadata(got)["manifest_sha256"]}
