"""``functions demo --serve`` stopped with SIGTERM stops its three services, as Ctrl-C does;
and it greets a first user without warnings (it brings a cache secret of its own)."""

import os
import signal
import socket
import subprocess
import sys
import time

from tests.support.services import REPO


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def free_base_port() -> int:
    for base in range(18081, 18900, 3):
        if not any(listening(base + i) for i in range(3)):
            return base
    raise AssertionError("no three free ports")


def test_sigterm_stops_the_demo_services(docker_host, tmp_path):
    base = free_base_port()
    env = {**os.environ, "DOCKER_HOST": docker_host, "HOME": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "functions", "demo", "--serve", "--port", str(base)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if "services are up" in line:
                break
        assert all(listening(base + i) for i in range(3)), "".join(lines)
        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, rest
    assert "the check, get and put services are stopped" in rest
    warnings = [line for line in [*lines, *rest.splitlines()] if '"level": "warning"' in line]
    assert warnings == []
    deadline = time.monotonic() + 10
    while any(listening(base + i) for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(listening(base + i) for i in range(3))
