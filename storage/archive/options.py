"""What the archive code is told: the formats and their key suffixes, ``ArchiveOptions``
(how ``pack`` compresses) and ``Limits`` (what ``unpack`` will extract). Below every other
archive module: it imports none of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from storage.tuning import env_int

FORMATS = ("zstd", "gzip", "none")
AUTO: Literal["auto"] = (
    "auto"  # ARCHIVE_LEVEL=auto: zstd's level follows the bottleneck (archive/adaptive.py)
)
_SUFFIXES = {"zstd": ".tar.zst", "gzip": ".tar.gz", "none": ".tar"}
_LEVELS = {"zstd": range(1, 23), "gzip": range(10)}
Level = int | Literal["auto"]


def suffix_for(format: str) -> str:
    """The key suffix of ``format`` (``.tar.zst``, ``.tar.gz``, ``.tar``)."""
    check_format(format)
    return _SUFFIXES[format]


def format_for_key(key: str) -> str:
    """The format named by ``key``'s suffix; ``ValueError`` for any other suffix."""
    for format, suffix in _SUFFIXES.items():
        if key.endswith(suffix):
            return format
    raise ValueError(f"{key!r}: an artifact key ends in .tar.zst, .tar.gz or .tar")


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"archive format {format!r}: expected one of {', '.join(FORMATS)}")


@dataclass(frozen=True)
class ArchiveOptions:
    """How ``pack`` compresses. ``threads=0`` uses every CPU this process may run on.
    ``level="auto"`` (zstd only) lets the level follow the bottleneck while packing."""

    format: str = "zstd"
    level: Level = 3  # zstd 1..22 or "auto", gzip 0..9; ignored for "none"
    threads: int = 0  # zstd only

    def __post_init__(self) -> None:
        check_format(self.format)
        levels = _LEVELS.get(self.format)
        if self.level == AUTO and self.format == "gzip":
            raise ValueError("level 'auto' is for zstd only: give gzip a level of 0..9")
        if levels is not None and self.level != AUTO and self.level not in levels:
            raise ValueError(
                f"{self.format} level {self.level} is out of range {levels[0]}..{levels[-1]}"
            )
        if self.threads < 0:
            raise ValueError(f"archive threads must be 0 (all CPUs) or more, not {self.threads}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ArchiveOptions:
        """Read ``ARCHIVE_FORMAT`` (zstd), ``ARCHIVE_LEVEL`` (3, or ``auto``) and
        ``ARCHIVE_THREADS`` (0)."""
        format = environ.get("ARCHIVE_FORMAT", "").strip().lower() or cls.format
        try:
            return cls(
                format=format,
                level=level_from_env(environ, cls.level),
                threads=env_int(environ, "ARCHIVE_THREADS", cls.threads),
            )
        except ValueError as err:
            raise ValueError(f"archive settings from the environment: {err}") from None


def level_from_env(environ: Mapping[str, str], default: Level) -> Level:
    """``ARCHIVE_LEVEL``: ``auto`` (any case) or an integer; unset or blank: ``default``."""
    raw = environ.get("ARCHIVE_LEVEL", "").strip()
    if raw.lower() == AUTO:
        return AUTO
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(f"ARCHIVE_LEVEL={raw!r}: not an integer or 'auto'") from None


@dataclass(frozen=True)
class Limits:
    """Bounds on what ``unpack`` extracts; exceeding any raises ``ArchiveRejected``."""

    max_entry_bytes: int = 8 << 30
    max_total_bytes: int = 32 << 30
    max_entries: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("max_entry_bytes", "max_total_bytes", "max_entries"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"archive limit {name} must be a positive integer, not {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        """Read ``ARCHIVE_MAX_ENTRY_BYTES`` (8 GiB), ``ARCHIVE_MAX_TOTAL_BYTES`` (32 GiB) and
        ``ARCHIVE_MAX_ENTRIES`` (1,000,000); integers, unset or empty means the default."""
        try:
            return cls(
                max_entry_bytes=env_int(environ, "ARCHIVE_MAX_ENTRY_BYTES", cls.max_entry_bytes),
                max_total_bytes=env_int(environ, "ARCHIVE_MAX_TOTAL_BYTES", cls.max_total_bytes),
                max_entries=env_int(environ, "ARCHIVE_MAX_ENTRIES", cls.max_entries),
            )
        except ValueError as err:
            raise ValueError(f"archive limits from the environment: {err}") from None
