"""A Podman API service of a test's own, on a socket it names (``podman system service``).

    podman_service(socket, log, env) -> the process, once the socket exists

Its output goes to a file, never a pipe that nobody reads: a full pipe would block the engine
mid-test. The caller stops it (``terminate``), or kills it to play a crash.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from testbed.process import START_TIMEOUT, ServerError


def podman_service(
    socket: Path, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``podman system service`` on ``unix://socket``, with no idle exit, started afresh (a
    socket left from before is removed), its output appended to ``log``; ``env``: its whole
    environment (None: this process's). ``ServerError`` with the output if it exits or its
    socket does not appear within ``START_TIMEOUT``."""
    socket.unlink(missing_ok=True)
    command = ["podman", "system", "service", "--time=0", f"unix://{socket}"]
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT
    while not socket.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            output = log.read_text(errors="replace")[-4000:]
            raise ServerError(f"podman system service did not start ({socket}):\n{output}")
        time.sleep(0.1)
    return process
