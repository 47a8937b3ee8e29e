"""The services as processes on this machine: started, waited for until they serve, stopped
with their drain. One launcher for the demo and the tests' harness, and one way to wait.

    launched = launch(env, actions=("check", "get", "put"))
    launched.wait_serving()          # NotReady, with the reason, if one exits or stays down
    ...                              # launched.urls["get"] is http://127.0.0.1:PORT
    launched.stop()                  # SIGTERM, then each drain (runs under way, cleanup)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

import requests

from functions.http.serving import GRACEFUL_TIMEOUT_SECONDS
from functions.model import ACTIONS

REPO = Path(__file__).resolve().parents[2]
SERVE = (sys.executable, "-m", "functions", "serve")


class NotReady(RuntimeError):
    """What was awaited did not come about in time, or its process exited first."""


def wait_until(
    ready: Callable[[], object],
    what: str,
    timeout: float = 30.0,
    *,
    alive: Callable[[], bool] | None = None,
    interval: float = 0.05,
) -> object:
    """``ready()``'s first true value, polled every ``interval`` seconds. ``NotReady`` naming
    ``what`` once ``timeout`` has passed, or at once when ``alive()`` turns false (the process
    that should have made it true has exited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if alive is not None and not alive():
            raise NotReady(f"{what}: its process exited")
        if time.monotonic() > deadline:
            raise NotReady(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """``preferred`` if nothing listens on it on ``host``, else any free port."""
    with socket.socket() as sock:
        try:
            sock.bind((host, preferred))
        except OSError:
            sock.bind((host, 0))
        return int(sock.getsockname()[1])


def serving(url: str) -> bool:
    """The service at ``url`` answers its liveness probe."""
    try:
        return requests.get(url + "/healthz", timeout=1).ok
    except (requests.ConnectionError, requests.Timeout):  # bound, worker not booted yet
        return False


def alive(proc: subprocess.Popen[bytes]) -> bool:
    """``proc`` has not exited (``wait_until``'s ``alive``)."""
    return proc.poll() is None


@dataclass
class Launched:
    """The services started by ``launch``, by action."""

    urls: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def wait_serving(self, timeout: float = 30.0) -> None:
        for action, url in self.urls.items():
            proc = self.procs[action]
            wait_until(
                partial(serving, url),
                f"the {action} service on {url}",
                timeout,
                alive=partial(alive, proc),
            )

    def stop(self) -> None:
        """SIGTERM, then wait for each service's drain; kill one that outlasts it."""
        for proc in self.procs.values():
            proc.terminate()
        deadline = time.monotonic() + GRACEFUL_TIMEOUT_SECONDS + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def launch(
    env: Mapping[str, str],
    *,
    actions: Sequence[str] = ACTIONS,
    host: str = "127.0.0.1",
    ports: Mapping[str, int] | None = None,
    output: IO[bytes] | None = None,
) -> Launched:
    """Start ``python -m functions serve ACTION`` for each action with ``env`` (this checkout
    on its PYTHONPATH), on the port ``ports`` prefers for it (else a free one); their output
    goes to ``output`` (inherited if None). Not waited for: ``Launched.wait_serving``."""
    launched = Launched(urls={})
    for action in actions:
        port = free_port(host, (ports or {}).get(action, 0))
        launched.procs[action] = subprocess.Popen(
            [*SERVE, action, "--host", host, "--port", str(port)],
            env={**env, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdout=output,
            stderr=output,
        )
        launched.urls[action] = f"http://{host}:{port}"
    return launched
