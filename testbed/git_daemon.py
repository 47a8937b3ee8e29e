"""``git daemon`` serving the repositories under a directory on 127.0.0.1 (pushes allowed),
for the tests (``tests/support/git_server.py``) and ``bench/warm_check.py``."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.process import free_port


@contextmanager
def git_daemon(root: Path) -> Iterator[int]:
    """``git daemon`` serving the repositories under ``root`` on 127.0.0.1 (pushes allowed),
    for the block; its port."""
    port = free_port()
    daemon = subprocess.Popen(
        [
            "git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
            f"--base-path={root}", "--listen=127.0.0.1", f"--port={port}", str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, daemon)
        yield port
    finally:
        daemon.terminate()
        daemon.wait(10)


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("git daemon exited")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("git daemon did not listen within 10 s")
