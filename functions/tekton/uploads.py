"""What one team and one replica of the artifacts service take in uploads (a Task's
``resource-functions-pack``): no client can exhaust the service or the store.

- **A replica's memory.** An S3 upload holds ``(concurrency + 1) * part_size`` bytes (8 MiB
  parts: about 49 MiB at the library's 4 parts in flight, so five uploads at once crashed a
  256Mi replica). The service uploads 2 parts at a time (about 25 MiB each) and takes
  ``ARTIFACT_UPLOADS`` (default 2) at once per replica, all but one of them at most for one
  team (so no team holds every slot): one more is 429 with ``Retry-After`` (the pack step
  waits and tries again). An upload's body must keep coming (``MIN_RATE`` on average after
  its first ``RATE_GRACE_SECONDS``), or it is dropped (408): a slot is not held by a drip.
- **A team's share of the store.** ``ARTIFACT_UPLOADS_PER_HOUR`` uploads (default 120) and
  ``ARTIFACT_UPLOAD_BYTES_PER_HOUR`` bytes (default 20 GiB) per team and clock hour, counted
  in the store (``quotas/uploads/<team>.json``, compare-and-swap: every replica counts
  alike); past either, 429 until the hour ends. Bytes are counted as each upload ends, so
  the uploads under way when the quota is reached (a few per replica) may go past it.
- **The format said.** The first bytes must be the format's own (zstd's or gzip's magic
  number; for a plain tar, a header block, ``ustar`` at its offset 257, or the end of an
  empty archive): anything else is 400 before it is stored.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from functions.settings import UploadLimits
from storage import Store
from storage.compare_and_swap import update_record

PART_CONCURRENCY = 2  # S3 parts in flight per upload through the service
BUSY_RETRY_SECONDS = 5  # the Retry-After of a replica at its uploads at once
QUOTA_RECORDS = "quotas/uploads/"
MAGIC = {"zstd": b"\x28\xb5\x2f\xfd", "gzip": b"\x1f\x8b"}
TAR_BLOCK = 512


class Busy(Exception):
    """No room now; ``retry_after`` seconds until there may be."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Uploads:
    """The replica's gate and the teams' quota (module docstring)."""

    def __init__(self, store: Store, limits: UploadLimits) -> None:
        self.store = store
        self.limits = limits
        self._teams: dict[str, int] = {}  # team -> its uploads under way here (all: the slots')
        self._lock = threading.Lock()
        self._per_team = max(1, limits.per_replica - 1)  # one team never takes every slot

    @contextmanager
    def slot(self, team: str, now: datetime) -> Iterator[None]:
        """Room for one upload of ``team``: a replica's slot and the team's quota (``Busy``
        otherwise); the upload's size is counted with ``counted``."""
        with self._lock:
            if self._teams.get(team, 0) >= self._per_team:
                raise Busy(
                    f"team {team!r} has {self._per_team} upload(s) under way on this replica, "
                    "as many as one team may: try again shortly",
                    BUSY_RETRY_SECONDS,
                )
            if sum(self._teams.values()) >= self.limits.per_replica:
                raise Busy(
                    f"this replica takes {self.limits.per_replica} uploads at once "
                    "(ARTIFACT_UPLOADS): try again shortly",
                    BUSY_RETRY_SECONDS,
                )
            self._teams[team] = self._teams.get(team, 0) + 1
        try:
            self._reserve(team, now)
            yield
        finally:
            with self._lock:
                self._teams[team] -= 1
                if not self._teams[team]:
                    del self._teams[team]

    def counted(self, team: str, size: int, now: datetime) -> None:
        """Add an upload's ``size`` to its team's bytes of the hour."""
        update_record(self.store, quota_key(team), lambda data: _add(data, now, 0, size))

    def _reserve(self, team: str, now: datetime) -> None:
        def change(data: bytes | None) -> tuple[bytes | None, str]:
            used = _used(data, now)
            if used["count"] >= self.limits.count_per_hour:
                return None, f"{used['count']} uploads this hour (ARTIFACT_UPLOADS_PER_HOUR)"
            if used["bytes"] >= self.limits.bytes_per_hour:
                return None, f"{used['bytes']} bytes this hour (ARTIFACT_UPLOAD_BYTES_PER_HOUR)"
            used["count"] += 1
            return json.dumps(used).encode(), ""

        over = update_record(self.store, quota_key(team), change)
        if over:
            left = 3600 - now.minute * 60 - now.second
            raise Busy(f"team {team!r} is at its upload quota: {over}", max(left, 1))


def quota_key(team: str) -> str:
    return f"{QUOTA_RECORDS}{team or '_'}.json"


def _hour(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H")


def _used(data: bytes | None, now: datetime) -> dict[str, Any]:
    """The team's count and bytes of ``now``'s hour (none from an hour before)."""
    try:
        found = json.loads(data) if data else {}
    except ValueError:
        found = {}
    if not isinstance(found, dict) or found.get("hour") != _hour(now):
        return {"hour": _hour(now), "count": 0, "bytes": 0}
    return {"hour": found["hour"], "count": int(found["count"]), "bytes": int(found["bytes"])}


def _add(data: bytes | None, now: datetime, count: int, size: int) -> tuple[bytes, None]:
    used = _used(data, now)
    used["count"] += count
    used["bytes"] += size
    return json.dumps(used).encode(), None


def looks_like(format: str, head: bytes) -> bool:
    """Whether ``head`` (``head_size(format)`` bytes, or fewer at the end) starts ``format``."""
    if format == "none":
        block = head[:TAR_BLOCK]
        return len(block) == TAR_BLOCK and (block[257:262] == b"ustar" or not any(block))
    return head.startswith(MAGIC[format])


def head_size(format: str) -> int:
    return TAR_BLOCK if format == "none" else len(MAGIC[format])


class NotTheFormat(Exception):
    """An upload whose first bytes are not its format's."""


class FormatChecked:
    """An upload's body, its first bytes checked as ``format``'s (``looks_like``) before any
    is handed on (``NotTheFormat`` otherwise)."""

    def __init__(self, stream: Any, format: str) -> None:
        self._stream = stream
        self._format = format
        self._head: bytes | None = b""  # None once checked and handed on

    def read(self, size: int = -1) -> bytes:
        if self._head is None:
            return bytes(self._stream.read(size))
        wanted = head_size(self._format)
        while len(self._head) < wanted:
            chunk = bytes(self._stream.read(wanted - len(self._head)))
            if not chunk:
                break
            self._head += chunk
        if not looks_like(self._format, self._head):
            raise NotTheFormat(
                f"the upload does not start as a {self._format} artifact does "
                f"({'a tar header block' if self._format == 'none' else 'its magic number'})"
            )
        head, self._head = self._head, None
        return head

    def readable(self) -> bool:
        return True
