"""A root filesystem get on the real cluster: the rootfs resource of the e2e tests
(tests/support/images/rootfs-resource) runs in a task pod, copies its image's own root filesystem into
the get's output and takes its manifest; ``collect`` stores it. Unpacked here, the artifact
equals that manifest entry by entry.

Two things are the pod's doing, and are asserted as such. The directories the resource makes
in the pod's build volume inherit its set-group-ID bit (Kubernetes sets it for the pod's
``fsGroup``; ``cp -a`` keeps an inherited one, as the manifest shows). After the resource has
run, the resource step opens its output to the non-root ``collect`` step with ``chmod -R a+rX``
(podspec.RESOURCE_SCRIPT), so modes gain read for all (and search on directories and on files
something may execute): the only difference between the manifest and the artifact. Everything
else (types, link targets, special bits, owners, mtimes, sizes, contents, hard links, kept
xattrs) is as the resource wrote it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import ClusterDeployment, cluster_services
from tests.support.fidelity_resources import (
    CONTENT,
    GID,
    GROUP,
    KIND,
    MODE,
    PATH,
    XATTRS,
    manifest,
    mismatches,
    parse_manifest,
    rootfs_resource,
    unpack_artifact,
)
from tests.support.round_trip import succeeded


@pytest.fixture(scope="module")
def rootfs_deployment(
    cluster, cluster_images, gateway_s3, namespace, functions_kubeconfig, tmp_path_factory
) -> Iterator[ClusterDeployment]:
    image = rootfs_resource()
    cluster.import_images((image,))
    with cluster_services(
        cluster,
        cluster_images["task"],
        json.dumps({"rootfs": image}),
        gateway_s3,
        namespace,
        functions_kubeconfig,
        tmp_path_factory.mktemp("rootfs-deployment"),
    ) as deployed:
        yield deployed


def opened_for_collect(entries: list[list[Any]]) -> list[list[Any]]:
    """``entries`` with the modes ``chmod -R a+rX`` leaves (links are not changed)."""
    return [entry if entry[KIND] == "l" else opened(entry) for entry in entries]


def opened(entry: list[Any]) -> list[Any]:
    mode = int(entry[MODE], 8)
    search = 0o111 if entry[KIND] == "d" or mode & 0o111 else 0
    return [*entry[:MODE], format(mode | 0o444 | search, "o"), *entry[MODE + 1 :]]


def test_a_rootfs_get_in_a_task_pod_is_the_tree_the_resource_wrote(rootfs_deployment, tmp_path):
    data = {"type": "rootfs", "source": {}, "version": {"tree": "root"}}
    reply = succeeded(rootfs_deployment.services.urls, "get", data, timeout=300)
    assert reply["cached"] is False
    assert rootfs_deployment.jobs(**{"resource-functions.dev/action": "get"}), "ran as a Job"

    tree = unpack_artifact(rootfs_deployment.store, reply["artifact"], tmp_path)
    written = (tree / "manifest.jsonl").read_bytes()
    metadata = {item["name"]: item["value"] for item in reply["metadata"]}
    assert hashlib.sha256(written).hexdigest() == metadata["manifest_sha256"]
    written_entries = parse_manifest(written.decode())
    assert len(written_entries) > 7000
    unpacked = manifest(tree / "rootfs")
    assert mismatches(unpacked, opened_for_collect(written_entries)) == []
    entries = {entry[PATH]: entry for entry in unpacked}
    assert entries["etc/localtime"][CONTENT] == "/usr/share/zoneinfo/Etc/UTC"
    assert entries["usr/bin/su"][MODE] == "4755"
    assert entries["usr/bin/perl5.36.0"][GROUP] == "usr/bin/perl"
    assert "security.capability" in entries["srv/cases/ping"][XATTRS]
    # 0700 in the image; written 2700 into the set-group-ID build volume; then a+rX.
    assert {e[PATH]: e for e in written_entries}["home/user"][MODE] == "2700"
    assert entries["home/user"][MODE : GID + 1] == ["2755", 1000, 1000]
