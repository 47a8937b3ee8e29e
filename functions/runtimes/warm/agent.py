"""The function's side of rf-agent (``agent/main.go``) in a warm pod: one check over HTTP on
the pod network, no API server in the way (docs/warm-checks.md).

``POST http://<pod IP>:7777/check`` with the pod's token, the source's directory, the check's
budget and its request as the body; the answer streams frames (a type byte, a 4-byte
big-endian length, the payload): ``o`` stdout, ``e`` stderr, then ``x`` with the exit code or
``t`` when the budget ran out (the agent killed that check's processes, and only those).
Closing the answer early ends the check as well (a sender's stop).
"""

from __future__ import annotations

import hmac
import struct
import threading
import time
from typing import Any

import requests

from functions.errors import Unavailable
from functions.runtimes.output import STDERR, STDOUT, Output
from functions.runtimes.warm.pool import Busy, Gone, NoRoom

PORT = 7777
GRACE_SECONDS = 10.0  # past the budget, for the agent to say it ran out
STREAMS = {b"o": STDOUT, b"e": STDERR}
MAX_FRAME = 64 * 1024  # the agent sends at most 32 KiB a frame: more is not the agent


def pod_token(secret: bytes, pod: str) -> str:
    """The token of one warm pod's agent: an HMAC of its name under ``CACHE_SECRET``, so one
    pod's token opens no other pod (and a replica finds it again after a restart)."""
    return hmac.new(secret, f"warm-agent:{pod}".encode(), "sha256").hexdigest()


class AgentCall:
    """One check through a pod's agent; ``cancel()`` (from another thread) ends it alone."""

    def __init__(self, session: requests.Session, address: str, token: str) -> None:
        self._session = session
        self._url = f"http://{address}:{PORT}/check"
        self._token = token
        self._response: Any = None
        self._lock = threading.Lock()
        self._cancelled = False

    def run(self, source: str, stdin: bytes, budget: float, output: Output) -> int | None:
        """The check's exit code, its output into ``output``; None over its budget. ``Gone``
        when the agent cannot be reached (the pod died); ``Busy`` or ``NoRoom`` when it
        refuses the check for now; ``Unavailable`` for a stream cut midway."""
        headers = {
            "Authorization": f"Bearer {self._token}",
            "X-RF-Source": source,
            "X-RF-Timeout": f"{budget:.3f}",
        }
        try:
            response = self._session.post(
                self._url,
                data=stdin,
                headers=headers,
                stream=True,
                timeout=(5.0, budget + GRACE_SECONDS),
            )
        except requests.ConnectionError as err:
            raise Gone() from err
        except requests.RequestException as err:
            raise Unavailable(f"warm pod agent: {err}") from err
        with self._lock:
            self._response = response
            if self._cancelled:
                response.close()
        with response:
            if response.status_code == 409:
                raise Busy("the agent still runs this source's previous check")
            if response.status_code == 429:
                raise NoRoom("the agent runs as many checks as it takes")
            if response.status_code != 200:
                raise Unavailable(
                    f"warm pod agent answered {response.status_code}: {response.text[:200]}"
                )
            return self._frames(response.raw, output, time.monotonic() + budget + GRACE_SECONDS)

    def cancel(self) -> None:
        """End the check under way (the agent kills its processes when the answer closes)."""
        with self._lock:
            self._cancelled = True
            if self._response is not None:
                self._response.close()

    def _frames(self, raw: Any, output: Output, deadline: float) -> int | None:
        """The answer's frames, each checked as the agent writes them: whatever else answers on
        the pod's port (the check runs as the agent's user, and may kill it) gets no more than
        a malformed stream's ``Unavailable`` (the pod is then replaced)."""
        try:
            while True:
                head = _read(raw, 5)
                kind, size = head[:1], struct.unpack(">I", head[1:])[0]
                if size > MAX_FRAME or (kind == b"x" and size != 4) or (kind == b"t" and size):
                    raise ValueError(f"a frame {kind!r} of {size} bytes")
                payload = _read(raw, size)
                if kind in STREAMS:
                    output.add(STREAMS[kind], payload)
                elif kind == b"x":
                    output.complete = True
                    return int(struct.unpack(">i", payload)[0])
                elif kind == b"t":
                    output.complete = True
                    return None
                else:
                    raise ValueError(f"a frame of unknown kind {kind!r}")
                if time.monotonic() > deadline:
                    return None
        except ValueError as err:
            raise Unavailable(f"warm pod agent: not the agent's answer: {err}") from err
        except (OSError, requests.RequestException, EOFError) as err:
            if self._cancelled:
                return None  # ended by its sender's stop: the caller raises RunStopped
            raise Unavailable(f"warm pod agent: the check's stream was cut: {err}") from err


def _read(raw: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = raw.read(size - len(data))
        if not chunk:
            raise EOFError("the agent's answer ended before its last frame")
        data += chunk
    return data
