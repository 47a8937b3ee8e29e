"""Structured (JSON lines) logging. Callers pass only safe fields: ids, names, kinds,
durations — never a request's ``source`` or ``params``."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

SAFE_EXTRA = "fields"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        body.update(getattr(record, SAFE_EXTRA, {}))
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


class LineHandler(logging.Handler):
    """Writes formatted lines to a stream without making a logging thread wait.

    A line is formatted in the calling thread, then queued; whichever thread gets the write
    lock writes every queued line in one call, and the others go on. A thread waiting for
    the stream (a write releases the GIL) thus holds up no request that logs: under many
    request threads, a lock held across each write queued them all behind it. No line is
    left behind: every queueing and every release of the lock is followed by a look at
    the queue. Lines keep the order in which they were queued.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._lines: deque[str] = deque()
        self._writing = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record) + "\n")
            while self._lines and self._writing.acquire(blocking=False):
                try:
                    self._write_queued()
                finally:
                    self._writing.release()
        except Exception:  # noqa: BLE001 - as StreamHandler: logging must not fail the caller
            self.handleError(record)

    def handle(self, record: logging.LogRecord) -> bool:
        """As ``Handler.handle`` without its lock around ``emit``."""
        passed = self.filter(record)
        if passed:
            self.emit(passed if isinstance(passed, logging.LogRecord) else record)
        return bool(passed)

    def _write_queued(self) -> None:
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        self.stream.write("".join(lines))
        self.stream.flush()


def configure(level: str) -> None:
    """Send JSON lines to stderr at ``level`` (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        handler = LineHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in (
        "docker",
        "urllib3",
        "botocore",
        "boto3",
        "s3transfer",
        "google",
        "asyncio",
        "kubernetes",
    ):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: ``log.info("run finished", extra=fields(run_id=…))``."""
    return {SAFE_EXTRA: values}
