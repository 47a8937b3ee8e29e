"""A git repository with links committed, served by ``git daemon`` on loopback (pushes
allowed), for the tests that clone from it and push to it.

    served_repository(root, host) -> (its git:// URI, the bare repository), for the block
    git(*args, cwd) -> git's stdout (a fixed committer)
    working_tree_links(tree) -> path -> target of each link of a clone, .git/ left out
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.git_daemon import git_daemon

LINKS = {
    "ca.crt": "/etc/ssl/certs/ca-certificates.crt",  # absolute, as repositories commit them
    "sub/climbs": "../../outside/of/the/repository",
    "sub/readme": "../README",
}


def git(*args: str, cwd: Path) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


def working_tree_links(tree: Path) -> dict[str, str]:
    return {
        path.relative_to(tree).as_posix(): os.readlink(path)
        for path in sorted(tree.rglob("*"))
        if path.is_symlink() and ".git" not in path.relative_to(tree).parts
    }


@contextmanager
def served_repository(root: Path, host: str = "127.0.0.1") -> Iterator[tuple[str, Path]]:
    """One commit on ``main`` holding LINKS, a file and an executable, in ``root/repo.git``,
    served on ``host`` (loopback, or the test cluster's gateway) for the block."""
    work = root / "work"
    (work / "sub").mkdir(parents=True)
    (work / "README").write_text("a repository with links\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    for name, target in LINKS.items():
        os.symlink(target, work / name)
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "links", cwd=work)
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    with git_daemon(root, host) as port:
        yield f"git://{host}:{port}/repo.git", root / "repo.git"
