"""A stream wrapper that reports bytes moved on stderr, for people watching long transfers."""

from __future__ import annotations

import sys
import time
from typing import Any, BinaryIO, TextIO


class ProgressReader:
    """Reads through ``stream``; at most every ``interval`` seconds writes
    ``label: N MB (R MB/s)`` to ``out``, and a final line on ``close``/exhaustion."""

    def __init__(
        self, stream: BinaryIO, label: str, *, out: TextIO = sys.stderr, interval: float = 0.5
    ) -> None:
        self._stream = stream
        self._label = label
        self._out = out
        self._interval = interval
        self._started = self._shown = time.monotonic()
        self.count = 0
        self._done = False

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.count += len(data)
        now = time.monotonic()
        if not data:
            self.finish()
        elif now - self._shown >= self._interval:
            self._shown = now
            self._report(now, end="\r")
        return data

    def readable(self) -> bool:
        return True

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self._report(time.monotonic(), end="\n")

    def _report(self, now: float, *, end: str) -> None:
        mb = self.count / 1e6
        rate = mb / max(now - self._started, 1e-6)
        self._out.write(f"{self._label}: {mb:.1f} MB ({rate:.1f} MB/s){end}")
        self._out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
