"""Structured (JSON lines) logging. Callers pass only safe fields: ids, names, kinds,
durations — never a request's ``source`` or ``params``."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

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


def configure(level: str) -> None:
    """Send JSON lines to stderr at ``level`` (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
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
