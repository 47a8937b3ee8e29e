"""A git repository with links committed, served by ``git daemon`` on loopback (pushes
allowed), for the tests and checks that clone from it and push to it.

    served_repository(root) -> (its git:// URI, the bare repository), for the block
    git(*args, cwd) -> git's stdout (a fixed committer)
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


@contextmanager
def served_repository(root: Path) -> Iterator[tuple[str, Path]]:
    """One commit on ``main`` holding LINKS, a file and an executable, in ``root/repo.git``,
    served on 127.0.0.1 for the block."""
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
    with git_daemon(root) as port:
        yield f"git://127.0.0.1:{port}/repo.git", root / "repo.git"
