"""``git daemon`` serving the repositories under a directory (pushes allowed), for the tests
(``tests/support/git_server.py``) and ``bench/warm_check.py``."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from functions.cli.launch import alive, free_port, wait_until


@contextmanager
def git_daemon(root: Path, host: str = "127.0.0.1") -> Iterator[int]:
    """``git daemon`` serving the repositories under ``root`` on ``host`` (pushes allowed),
    for the block; its port."""
    port = free_port(host)
    daemon = subprocess.Popen(
        [
            "git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
            f"--base-path={root}", f"--listen={host}", f"--port={port}", str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(
            partial(_listens, host, port), f"git daemon on {host}:{port}", 10,
            alive=partial(alive, daemon),
        )  # fmt: skip
        yield port
    finally:
        daemon.terminate()
        daemon.wait(10)


def _listens(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0
