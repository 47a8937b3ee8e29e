"""A Podman API service of a test's own, on a socket it names (``podman system service``).

    podman_service(socket, log, env) -> the process, once the socket exists

Its output goes to a file (``testbed.process.start``), never a pipe that nobody reads: a full
pipe would block the engine mid-test. The caller stops it (``terminate``), or kills it to play
a crash. At ``log_level="info"`` the log also holds one access line per API request
(``"GET /v1.41/containers/json HTTP/1.1" 200``): what a bench counts engine requests by.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from testbed.process import start


def podman_service(
    socket: Path, log: Path, env: Mapping[str, str] | None = None, *, log_level: str = ""
) -> subprocess.Popen[bytes]:
    """``podman system service`` on ``unix://socket``, with no idle exit, started afresh (a
    socket left from before is removed), its output in ``log``; ``env``: its whole
    environment (None: this process's); ``log_level``: podman's ``--log-level`` (default:
    podman's own, warnings and errors). ``ServerError`` with the output if it exits or its
    socket does not appear in time."""
    socket.unlink(missing_ok=True)
    level = [f"--log-level={log_level}"] if log_level else []
    command = ["podman", *level, "system", "service", "--time=0", f"unix://{socket}"]
    return start("podman system service", command, log, socket.exists, f"make {socket}", env)
