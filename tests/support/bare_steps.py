"""A resource's step run bare (``podman run`` of its image alone, no services), and what the
same step through the services is compared with it by.

    bare(image, command, request, directory) -> the step's stdout, parsed
    without_mtimes(entries), git_comparable(entries)
        manifest entries with what two runs of a step differ in left out
    said_apart(reply, said) -> where a reply's version and metadata differ from a bare step's
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.fidelity_resources import MTIME, PATH

# Git's files in a clone that hold times of the run (the index keeps each file's ctime).
GIT_TIMED = (".git/index", ".git/FETCH_HEAD", ".git/ORIG_HEAD", ".git/logs/")


def bare(image: str, command: str, request: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``/opt/resource/<command> /tmp/build/dir`` of ``image`` run by Podman alone on the
    host's network, ``directory`` mounted there, ``request`` on its stdin; its answer."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [
        "podman", "run", "--rm", "-i", "--network=host", "-v", f"{directory}:/tmp/build/dir",
        image, f"/opt/resource/{command}", "/tmp/build/dir",
    ]  # fmt: skip
    stdin = json.dumps(request).encode()
    done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    assert done.returncode == 0, f"bare {command}: exit {done.returncode}\n{done.stderr.decode()}"
    return dict(json.loads(done.stdout))


def without_mtimes(entries: list[list[Any]]) -> list[list[Any]]:
    """The resources stamp what they write with the time they write it: two runs differ
    there (tests/e2e/test_rootfs_round_trip.py shows that artifacts keep mtimes exactly)."""
    return [[*entry[:MTIME], None, *entry[MTIME + 1 :]] for entry in entries]


def git_comparable(entries: list[list[Any]]) -> list[list[Any]]:
    """A clone's entries but for git's files that hold times of the run, without mtimes."""
    return without_mtimes([entry for entry in entries if not entry[PATH].startswith(GIT_TIMED)])


def said_apart(reply: dict[str, Any], said: dict[str, Any]) -> list[str]:
    """Where the reply's version and metadata differ from what the bare step printed."""
    pairs = [(reply["version"], said["version"])]
    pairs += list(zip(reply.get("metadata", []), said.get("metadata", []), strict=False))
    pairs.append((len(reply.get("metadata", [])), len(said.get("metadata", []))))
    return [f"{ours} != {theirs}" for ours, theirs in pairs if ours != theirs]
