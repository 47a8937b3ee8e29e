"""Directories in and out of a store: one artifact = one compressed tar object, streamed.

The key's suffix names the format (``.tar.zst``, ``.tar.gz``, ``.tar``), so a reader needs
nothing but the key. Neither direction holds the artifact in memory or in a temp file.

Beside an artifact, ``<name>.teams.json`` records the teams it belongs to (``add_team``): a
JSON object ``{"teams": ["main", ...]}`` updated by compare-and-swap, so concurrent writers
lose no team. ``""`` stands for requests that name no team.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import BinaryIO

from storage.archive import (
    FORMATS,
    ArchiveOptions,
    Limits,
    UnpackStats,
    format_for_key,
    pack,
    suffix_for,
    unpack,
)
from storage.base import ObjectInfo, Store
from storage.compare_and_swap import update_record

TEAMS_SUFFIX = ".teams.json"

# Wraps the raw (compressed) stream on its way to or from the store, e.g. to show progress.
StreamWrapper = Callable[[BinaryIO], BinaryIO]


def _as_is(stream: BinaryIO) -> BinaryIO:
    return stream


def upload_tree(
    store: Store,
    key: str,
    directory: str | os.PathLike[str],
    options: ArchiveOptions | None = None,
    *,
    wrap: StreamWrapper = _as_is,
) -> ObjectInfo:
    """Pack ``directory`` and store it under ``key`` (write-once); size and digest as stored.

    ``options`` defaults to ``ArchiveOptions()`` (zstd level 3); ``key`` must end in the
    suffix of its format (``ValueError`` otherwise). A failure while packing fails the
    upload, so no partial object becomes visible.
    """
    options = options or ArchiveOptions()
    if format_for_key(key) != options.format:
        raise ValueError(f"{key!r}: the key's suffix does not match format {options.format!r}")
    with pack(directory, options) as stream:
        return store.put(key, wrap(stream))


def download_tree(
    store: Store,
    key: str,
    directory: str | os.PathLike[str],
    *,
    expected_digest: str | None = None,
    limits: Limits | None = None,
    wrap: StreamWrapper = _as_is,
) -> UnpackStats:
    """Extract the artifact at ``key`` into ``directory``, as ``archive.unpack`` does.

    ``limits`` defaults to ``Limits()``. Raises ``ObjectNotFound`` and the other store
    errors, ``ArchiveError`` (and subclasses) for unsafe or corrupt content, ``ValueError``
    for a key without an artifact suffix.
    """
    format = format_for_key(key)
    with store.open(key) as stream:
        return unpack(
            wrap(stream),
            directory,
            format=format,
            expected_digest=expected_digest,
            limits=limits or Limits(),
        )


def teams_key(key: str) -> str:
    """The record of the teams of the artifact ``key`` (or of the artifact name ``key``
    without its format suffix, as a get knows it before it has a format)."""
    for suffix in (suffix_for(f) for f in FORMATS):
        if key.endswith(suffix):
            return key[: -len(suffix)] + TEAMS_SUFFIX
    return key + TEAMS_SUFFIX


def teams_of(store: Store, key: str) -> frozenset[str]:
    """The teams recorded for the artifact ``key`` (empty: none, or no record)."""
    record = store.read_record(teams_key(key))
    return _parse_teams(record.data if record else None)


def add_team(store: Store, key: str, team: str) -> None:
    """Record that ``team`` (``""``: no team) may use the artifact ``key`` (one read; one
    write when the team is new to it)."""

    def change(current: bytes | None) -> tuple[bytes | None, None]:
        teams = _parse_teams(current)
        if team in teams:
            return None, None
        body = {"teams": sorted(teams | {team})}
        return json.dumps(body, separators=(",", ":")).encode(), None

    update_record(store, teams_key(key), change)


def _parse_teams(data: bytes | None) -> frozenset[str]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        value = {}
    teams = value.get("teams") if isinstance(value, dict) else None
    return frozenset(t for t in teams or () if isinstance(t, str))
