"""``runs``, ``logs`` and ``versions``: what ran, and what a resource's checks found, read
from the store (``STORE_URL``) with the services' settings. Errors raise ``FunctionError``
or ``StorageError`` (one ``error:`` line, exit status 2, from ``commands.main``)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from functions import credentials, keys
from functions.cli.terminal_text import escape, escaped_chunks
from functions.errors import ConfigError
from functions.ledger import history, run_index
from functions.model import Build, Request
from functions.request_data import parse_request_data
from functions.service import checks
from functions.settings import Settings
from storage import ObjectNotFound, Store, open_store
from storage.base import url_prefix

DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
RUN_ID = re.compile(r"[0-9a-f]{32}")


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``1h``, ``2d`` in seconds; ``ConfigError`` otherwise."""
    match = DURATION.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"--since {text!r}: expected a duration such as 90s, 30m, 1h or 2d")
    return float(match[1]) * UNITS[match[2]]


def open_settings_store() -> tuple[Settings, Store]:
    settings = Settings.from_env()
    return settings, open_store(settings.store_url, settings.store_options)


def runs(since: str, *, failed: bool, out: TextIO, err: TextIO) -> int:
    """Print the runs started within ``since`` (oldest first); ``failed``: failures only."""
    window = parse_duration(since)
    _, store = open_settings_store()
    now = time.time()
    rows = run_index.list_runs(store, since=now - window, until=now, progress=Progress(err))
    shown = [row for row in rows if not failed or row.outcome == "failed"]
    out.write(format_runs(shown))
    return 0


def format_runs(rows: list[run_index.RunRow]) -> str:
    header = ("STARTED (UTC)", "ACTION", "TYPE", "OUTCOME", "KIND", "SECONDS", "RUN")
    table = [header] + [
        (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row.started_at)),
            row.action,
            row.type_name or row.image,
            row.outcome,
            row.kind or "-",
            "-" if row.seconds is None else f"{row.seconds:.2f}",
            row.run_id,
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in table
    ]
    return escape("\n".join(lines)) + "\n"  # a run's image and kind come from its request


def logs(run: str, *, out: Any, raw: bool = False) -> int:
    """Write the run's stored (redacted) log to ``out`` (binary), its control characters
    escaped (``functions.cli.terminal_text``); ``raw``: the bytes as stored."""
    if not RUN_ID.fullmatch(run):
        raise ConfigError(f"RUN_ID {run!r}: expected the 32 hex digits of a run id")
    _, store = open_settings_store()
    try:
        with store.open(keys.log_key(run)) as stream:
            if raw:
                while chunk := stream.read(1 << 16):
                    out.write(chunk)
            else:
                for text in escaped_chunks(stream):
                    out.write(text.encode())
    except ObjectNotFound:
        print(
            f"no log for run {run} (runs that failed before their script started have "
            "none; logs expire with the store's lifecycle rules)",
            file=sys.stderr,
        )
        return 1
    return 0


def versions(type_name: str, source: Any, *, team: str, pipeline: str, out: TextIO) -> int:
    """Print a resource's version history, newest first (``fly resource-versions``)."""
    settings, store = open_settings_store()
    if settings.cache_secret_generated:
        raise ConfigError(
            "CACHE_SECRET is not set: it names the resource's history; set the services' value"
        )
    request = resolved_check(
        settings, store, type_name, source, Build(team=team, pipeline=pipeline)
    )
    plan = checks.history_plan(
        request, cache_secret=settings.cache_secret, limit=settings.history_limit
    )
    assert plan is not None
    known = history.read(store, plan.resource_key)
    out.write(format_versions(known, plan.resource_key))
    return 0


def resolved_check(
    settings: Settings, store: Store, type_name: str, source: Any, build: Build
) -> Request:
    """The check a request of this resource would run: validated as the check service
    does, ``((var))`` references resolved by the configured provider for ``build``'s team
    and pipeline (``InvalidRequest`` naming a variable it cannot resolve)."""
    data: dict[str, Any] = {"type": type_name, "source": source}
    if build.team or build.pipeline:
        data["build"] = {k: v for k, v in (("team", build.team), ("pipeline", build.pipeline)) if v}
    request = parse_request_data(
        data,
        action="check",
        event={"id": "cli", "source": "/cli"},
        resource_types=settings.resource_types,
        artifact_url_prefix=keys.artifacts_url_prefix(url_prefix(store)),
        reply_async=False,
    )
    resolved = credentials.resolve(
        credentials.make_provider(settings),
        request.build,
        source=request.source,
        params=request.params,
        version=request.version,
    )
    return replace(request, source=resolved.source)


def format_versions(known: history.History, resource_key: str) -> str:
    if known.checked_at is None:
        return f"resource {resource_key[:16]}…: no successful check recorded\n"
    checked = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(known.checked_at))
    lines = [
        f"resource {resource_key[:16]}…: {len(known.versions)} versions, last checked {checked}",
        "#    VERSION",
    ]
    for number, version in reversed(list(enumerate(known.versions, 1))):
        shown = ",".join(f"{k}:{v}" for k, v in sorted(version.items()))
        lines.append(f"{number:<4} {escape(shown)}")  # a version is what a resource printed
    return "\n".join(lines) + "\n"


class Progress:
    """``runs: N/M records read`` on ``out`` at most every ``interval`` seconds, and a last
    line once any was shown (a short listing prints nothing)."""

    def __init__(
        self, out: TextIO, interval: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._out = out
        self._interval = interval
        self._clock = clock
        self._last = clock()
        self._showing = False

    def __call__(self, done: int, total: int) -> None:
        now, finished = self._clock(), done == total
        if now - self._last < self._interval and not (finished and self._showing):
            return
        self._last, self._showing = now, not finished
        self._out.write(f"runs: {done}/{total} records read" + ("\n" if finished else "\r"))
        self._out.flush()
