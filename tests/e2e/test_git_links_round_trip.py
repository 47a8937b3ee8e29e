"""A git repository with an absolute symlink committed, through the real services on Podman.
The resource is our own (tests/support/images/git-repo-resource: the local Debian base and Debian's
git): check asks a ``git daemon`` on loopback for the branch's head, in clones it, out checks
that the clone it was given is exactly its commit (``git status``), commits another absolute
link and pushes. Every link comes back exactly as git stores it, after the get and after the
put, and ``git status`` here finds the unpacked working tree equal to its commit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import open_store
from tests.support.fidelity_resources import git_repo_resource, unpack_artifact
from tests.support.git_server import LINKS, git, served_repository, working_tree_links
from tests.support.round_trip import put_input, succeeded
from tests.support.services import Services, running_services


@pytest.fixture(scope="module")
def services(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("git-links")
    (tmp / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps({"git": git_repo_resource()}),
        "CONTAINER_NETWORK": "host",  # to reach the git daemon on 127.0.0.1
        "CACHE_SECRET": "e2e-git-cache-secret",
        "STORE_URL": (tmp / "store").as_uri(),
        "WORK_DIR": str(tmp),
    }
    with running_services(env, tmp / "services.log") as services:
        yield services


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(its git:// URI, the bare repository): ``tests/support/git_server.py``'s."""
    with served_repository(tmp_path_factory.mktemp("git-server")) as served:
        yield served


def committed_links(bare: Path, ref: str) -> dict[str, str]:
    """Path -> target of every symlink in ``ref``'s tree, as git stores it."""
    links = {}
    for line in filter(None, git("ls-tree", "-r", "-z", ref, cwd=bare).split("\0")):
        meta, path = line.split("\t", 1)
        mode, _, blob = meta.split()
        if mode == "120000":
            links[path] = git("cat-file", "blob", blob, cwd=bare)
    return links


def get(services: Services, source: dict[str, str], version: dict[str, str]) -> dict[str, Any]:
    reply = succeeded(services.urls, "get", {"type": "git", "source": source, "version": version})
    assert reply["version"] == version
    return reply


def working_tree(services: Services, reply: dict[str, Any], into: Path) -> Path:
    """The get's artifact unpacked: a clone whose working tree ``git status`` finds equal
    to its commit (links, modes, contents), at the version fetched."""
    tree = unpack_artifact(open_store(services.env["STORE_URL"]), reply["artifact"], into)
    assert git("status", "--porcelain", "--untracked-files=all", cwd=tree) == ""
    assert git("rev-parse", "HEAD", cwd=tree).strip() == reply["version"]["ref"]
    return tree


def test_links_committed_to_git_come_back_exactly_through_get_and_put(
    services, repository, tmp_path
):
    uri, bare = repository
    main = {"uri": uri, "branch": "main"}
    (version,) = succeeded(services.urls, "check", {"type": "git", "source": main})["versions"]
    assert version == {"ref": git("rev-parse", "main", cwd=bare).strip()}
    assert committed_links(bare, "main") == LINKS

    got = get(services, main, version)
    tree = working_tree(services, got, tmp_path / "get")
    assert working_tree_links(tree) == LINKS
    assert os.stat(tree / "run.sh").st_mode & 0o111

    # The get's artifact as a put's input: out finds it equal to its commit, commits one
    # more absolute link on top and pushes it to another branch.
    copy = {"uri": uri, "branch": "copy"}
    artifact = got["artifact"]
    put = succeeded(
        services.urls,
        "put",
        {
            "type": "git",
            "source": copy,
            "params": {"repository": "repo", "link": "hostname", "target": "/etc/hostname"},
            "inputs": {"repo": put_input(artifact)},
        },
    )
    assert put["version"] == {"ref": git("rev-parse", "copy", cwd=bare).strip()}
    assert git("rev-parse", "copy~1", cwd=bare).strip() == version["ref"]
    pushed = {**LINKS, "hostname": "/etc/hostname"}
    assert committed_links(bare, "copy") == pushed
    again = working_tree(services, get(services, copy, put["version"]), tmp_path / "again")
    assert working_tree_links(again) == pushed
