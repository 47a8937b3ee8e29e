"""Directories in and out of a store: one artifact = one compressed tar object, streamed.

The key's suffix names the format (``.tar.zst``, ``.tar.gz``, ``.tar``), so a reader needs
nothing but the key. Neither direction holds the artifact in memory or in a temp file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import BinaryIO

from storage.archive import ArchiveOptions, Limits, UnpackStats, format_for_key, pack, unpack
from storage.base import ObjectInfo, Store

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
