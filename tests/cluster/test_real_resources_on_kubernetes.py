"""Concourse's real ``registry-image`` and ``git`` resources on the real cluster, through the
production path: request events posted to the Broker, the functions (Knative Services) running
each step in a task pod, replies back through the Broker to a sink; NetworkPolicies enforced.

``crane registry serve`` (holding the fidelity tests' root filesystem image) and ``git daemon``
(a repository with absolute and climbing links committed) listen on the gateway, a private
address the shipped ``task-pods`` policy keeps task pods from. The module adds what a user adds
for a registry or git server on a private address, an egress rule to exactly those two ports
(the harness's own gateway rule leaves them out), so the gets and puts below pass through it.

- registry-image: check answers the registry's digest; a ``format: rootfs`` get's artifact
  equals, entry by entry, what the bare ``in`` writes on Podman here, but for what the pod
  itself does (tests/cluster/test_rootfs_on_kubernetes.py: ``chmod -R a+rX`` for the
  non-root ``collect`` step);
- git: check answers the branch's head; the get's clone is that commit (``git status``
  clean, links exactly as git stores them); a put of it to another branch pushes it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.kubernetes import GATEWAY
from tests.cluster.test_knative_path import (
    assert_reply,
    jobs_of,
    post,
    ran_warm,
    reply_to,
    run_of_request,
)
from tests.cluster.test_rootfs_on_kubernetes import opened_for_collect
from tests.support.bare_steps import bare, without_mtimes
from tests.support.events import request_event
from tests.support.fidelity_resources import manifest, mismatches, rootfs_resource, unpack_artifact
from tests.support.git_server import LINKS, git, served_repository, working_tree_links
from tests.support.real_resources import crane, crane_registry


@dataclass(frozen=True)
class Servers:
    image_source: dict[str, Any]  # registry-image's source for the pushed rootfs image
    git_uri: str
    served: Path  # the bare repository

    @property
    def ports(self) -> tuple[int, int]:
        registry = self.image_source["repository"].split("/")[0]
        return int(registry.rsplit(":", 1)[1]), int(self.git_uri.split(":")[2].split("/")[0])


@pytest.fixture(scope="module")
def servers(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A registry and a git daemon on the gateway (an address of this machine too)."""
    root = tmp_path_factory.mktemp("real-servers")
    with (
        crane_registry(GATEWAY, root / "registry.log") as registry,
        served_repository(root / "git", host=GATEWAY) as (uri, served),
    ):
        repository = f"{registry}/fidelity/rootfs"
        push = ["podman", "push", "--quiet", "--tls-verify=false"]
        subprocess.run([*push, rootfs_resource(), f"{repository}:latest"], check=True)
        source = {"repository": repository, "tag": "latest", "insecure": True}
        yield Servers(source, uri, served)


@pytest.fixture(scope="module")
def task_egress(servers: Servers) -> list[dict]:
    """What a user adds to the task pods' policy for a registry and a git server on a private
    address (knative/network-policies.yaml): egress to them, and nothing more."""
    ports = [{"protocol": "TCP", "port": port} for port in servers.ports]
    return [{"to": [{"ipBlock": {"cidr": f"{GATEWAY}/32"}}], "ports": ports}]


@pytest.fixture(scope="module")
def deployed(knative_deployment, real_resource_images):
    return knative_deployment


def through_the_broker(deployment, action: str, data: dict[str, Any]) -> dict[str, Any]:
    """The reply's data to a request posted to the Broker, which ran as one Job (a get or a
    put) or in a warm pod (a check, as shipped)."""
    event = request_event(action, data)
    assert post(deployment.broker, event)[0] == 202
    reply = assert_reply(reply_to(deployment, event, action, timeout=300), event, action)
    if action == "check":
        assert ran_warm(deployment, run_of_request(event))
    else:
        assert len(jobs_of(deployment, event)) == 1
    return reply


def test_registry_image_rootfs_get_in_a_task_pod_is_what_the_bare_in_writes(
    deployed, servers, registry_image_resource, tmp_path
):
    source = servers.image_source
    checked = through_the_broker(deployed, "check", {"type": "registry-image", "source": source})
    version = checked["versions"][-1]
    digest = subprocess.run(
        [crane(), "digest", "--insecure", f"{source['repository']}:latest"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == {"digest": digest, "tag": "latest"}

    request = {"source": source, "version": version, "params": {"format": "rootfs"}}
    got = through_the_broker(deployed, "get", {"type": "registry-image", **request})
    assert got["cached"] is False
    ours = manifest(unpack_artifact(deployed.store, got["artifact"], tmp_path / "ours"))
    said = bare(registry_image_resource, "in", request, tmp_path / "bare")
    assert got["version"] == said["version"] == version
    assert len(ours) > 7000
    expected = opened_for_collect(manifest(tmp_path / "bare"))
    differ = mismatches(without_mtimes(ours), without_mtimes(expected))
    assert differ == [], "\n".join(differ)


def test_git_get_and_put_in_task_pods(deployed, servers, tmp_path):
    main = {"uri": servers.git_uri, "branch": "main"}
    head = {"ref": git("rev-parse", "main", cwd=servers.served).strip()}
    checked = through_the_broker(deployed, "check", {"type": "git", "source": main})
    assert checked["versions"][-1] == head

    got = through_the_broker(deployed, "get", {"type": "git", "source": main, "version": head})
    clone = unpack_artifact(deployed.store, got["artifact"], tmp_path / "clone")
    assert got["version"] == head
    assert working_tree_links(clone) == LINKS
    assert git("status", "--porcelain", "--untracked-files=all", cwd=clone) == ""
    assert git("rev-parse", "HEAD", cwd=clone).strip() == head["ref"]

    artifact = {key: got["artifact"][key] for key in ("url", "digest")}
    put = {
        "type": "git",
        "source": {**main, "branch": "pushed-from-a-pod"},
        "params": {"repository": "repo"},
        "inputs": {"repo": artifact},
    }
    assert through_the_broker(deployed, "put", put)["version"] == head
    assert git("rev-parse", "pushed-from-a-pod", cwd=servers.served).strip() == head["ref"]
