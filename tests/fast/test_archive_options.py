"""Archive settings: formats and key suffixes, options and limits from the environment."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from storage.archive import FORMATS, ArchiveOptions, Limits, format_for_key, pack, suffix_for


@pytest.mark.parametrize(
    ("format", "suffix"), [("zstd", ".tar.zst"), ("gzip", ".tar.gz"), ("none", ".tar")]
)
def test_format_and_suffix_correspond(format: str, suffix: str) -> None:
    assert suffix_for(format) == suffix
    assert format_for_key(f"artifacts/abc{suffix}") == format


@pytest.mark.parametrize("key", ["artifacts/abc.zip", "artifacts/abc.tar.xz", "abc", "x.zst"])
def test_unknown_key_suffix_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match=r"ends in \.tar\.zst, \.tar\.gz or \.tar"):
        format_for_key(key)


def test_defaults() -> None:
    assert ArchiveOptions() == ArchiveOptions.from_env({}) == ArchiveOptions("zstd", 3, 0)
    assert Limits() == Limits.from_env({}) == Limits(8 << 30, 32 << 30, 1_000_000)
    assert set(FORMATS) == {"zstd", "gzip", "none"}


def test_options_from_env() -> None:
    env = {"ARCHIVE_FORMAT": " GZIP ", "ARCHIVE_LEVEL": "9", "ARCHIVE_THREADS": "2"}
    assert ArchiveOptions.from_env(env) == ArchiveOptions("gzip", 9, 2)


@pytest.mark.parametrize("raw", ["auto", " AUTO ", "Auto"])
def test_archive_level_auto_is_read_in_any_case(raw: str) -> None:
    assert ArchiveOptions.from_env({"ARCHIVE_LEVEL": raw}) == ArchiveOptions(level="auto")


@pytest.mark.parametrize(("raw", "level"), [("1", 1), (" 19 ", 19), ("", 3), ("  ", 3)])
def test_archive_level_numbers_and_blank(raw: str, level: int) -> None:
    assert ArchiveOptions.from_env({"ARCHIVE_LEVEL": raw}).level == level


def test_archive_level_auto_without_compression_is_accepted_and_ignored() -> None:
    options = ArchiveOptions.from_env({"ARCHIVE_FORMAT": "none", "ARCHIVE_LEVEL": "auto"})
    assert options == ArchiveOptions("none", "auto")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ARCHIVE_FORMAT": "xz"}, "archive format 'xz': expected one of zstd, gzip, none"),
        ({"ARCHIVE_LEVEL": "fast"}, "ARCHIVE_LEVEL='fast': not an integer or 'auto'"),
        ({"ARCHIVE_LEVEL": "auto-ish"}, "ARCHIVE_LEVEL='auto-ish': not an integer or 'auto'"),
        (
            {"ARCHIVE_FORMAT": "gzip", "ARCHIVE_LEVEL": "auto"},
            "level 'auto' is for zstd only: give gzip a level of 0..9",
        ),
        ({"ARCHIVE_LEVEL": "23"}, "zstd level 23 is out of range 1..22"),
        ({"ARCHIVE_LEVEL": "0"}, "zstd level 0 is out of range 1..22"),
        ({"ARCHIVE_FORMAT": "gzip", "ARCHIVE_LEVEL": "10"}, "gzip level 10 is out of range 0..9"),
        ({"ARCHIVE_THREADS": "-1"}, "archive threads must be 0 (all CPUs) or more"),
    ],
    ids=[
        "unknown-format",
        "level-not-a-number",
        "level-almost-auto",
        "gzip-auto",
        "zstd-level-too-high",
        "zstd-level-zero",
        "gzip-level-too-high",
        "negative-threads",
    ],
)
def test_bad_options_from_env_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="archive settings from the environment") as caught:
        ArchiveOptions.from_env(env)
    assert message in str(caught.value)


def packed(directory: Path, options: ArchiveOptions) -> bytes:
    with pack(directory, options) as stream:
        return stream.read()


def test_level_is_ignored_without_compression(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"abc" * 1000)

    data = packed(tmp_path, ArchiveOptions(format="none", level=99))

    assert data == packed(tmp_path, ArchiveOptions(format="none"))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:  # plain tar, uncompressed
        assert tar.getnames() == ["file"]


@pytest.mark.parametrize("format", ["zstd", "gzip"])
def test_the_level_reaches_the_compressor(tmp_path: Path, format: str) -> None:
    (tmp_path / "file").write_bytes(bytes(range(256)) * 64 + b"x" * 100_000)
    low, high = _LEVELS_APART[format]

    fast = packed(tmp_path, ArchiveOptions(format=format, level=low))
    small = packed(tmp_path, ArchiveOptions(format=format, level=high))

    assert len(small) < len(fast)


_LEVELS_APART = {"zstd": (1, 19), "gzip": (0, 9)}


def test_limits_from_env() -> None:
    env = {
        "ARCHIVE_MAX_ENTRY_BYTES": "1_000",
        "ARCHIVE_MAX_TOTAL_BYTES": "5000",
        "ARCHIVE_MAX_ENTRIES": "10",
    }
    assert Limits.from_env(env) == Limits(1000, 5000, 10)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ARCHIVE_MAX_ENTRIES": "lots"}, "ARCHIVE_MAX_ENTRIES='lots': not an integer"),
        ({"ARCHIVE_MAX_TOTAL_BYTES": "0"}, "max_total_bytes must be a positive integer, not 0"),
        ({"ARCHIVE_MAX_ENTRY_BYTES": "-5"}, "max_entry_bytes must be a positive integer, not -5"),
    ],
    ids=["not-a-number", "zero", "negative"],
)
def test_bad_limits_from_env_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="archive limits from the environment") as caught:
        Limits.from_env(env)
    assert message in str(caught.value)
