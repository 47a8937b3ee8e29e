"""unpack of hostile, over-limit or corrupt streams: refused with a clear error, and nothing
is ever written outside the target directory.

Each case extracts into ``parent/target``; ``parent`` also holds a sentinel file, and the
listing (with file digests) of everything under ``tmp_path`` outside ``target`` must be the
same afterwards.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.archive import ArchiveOptions, Limits, pack, unpack
from storage.store_errors import ArchiveError, ArchiveRejected, DigestMismatch
from tests.support.archive_trees import (
    FORMATS,
    Entry,
    compress,
    dir_entry,
    file_entry,
    link_entry,
    listing,
    special_entry,
    tar_bytes,
)

ESCAPE = "escaped.txt"  # the name every escape attempt tries to create next to the sentinel
ETC_ESCAPE = Path("/etc/rf-hostile-test-escape")  # the one case that aims at the real /etc


@pytest.fixture
def target(tmp_path: Path) -> Path:
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "sentinel.txt").write_text("must stay as it is\n")
    return parent / "target"


def assert_nothing_outside(tmp_path: Path, target: Path, before: dict[str, object]) -> None:
    assert listing(tmp_path, excluding=target) == before
    assert not (tmp_path / ESCAPE).exists() and not (target.parent / ESCAPE).exists()
    assert not ETC_ESCAPE.exists()


def refused(tmp_path: Path, target: Path, stream: bytes, **kwargs: object) -> ArchiveError:
    """Unpack ``stream`` (plain tar unless ``format`` is given); return the error it raised,
    after checking that nothing outside ``target`` changed."""
    before = listing(tmp_path, excluding=target)
    kwargs.setdefault("format", "none")
    with pytest.raises(ArchiveError) as caught:
        unpack(io.BytesIO(stream), target, **kwargs)  # type: ignore[arg-type]
    assert_nothing_outside(tmp_path, target, before)
    assert not [t for t in threading.enumerate() if t.name.startswith("archive-")]
    return caught.value


def absolute_escape(tmp_path: Path) -> str:
    return str(tmp_path / ESCAPE)


def parent_dir(tmp_path: Path) -> str:
    """The absolute path of the directory holding the target (and the sentinel)."""
    return str(tmp_path / "parent")


HOSTILE: dict[str, tuple[Callable[[Path], list[Entry]], str]] = {
    "absolute-path": (lambda tmp: [file_entry(absolute_escape(tmp))], "absolute path"),
    "dot-dot": (lambda tmp: [file_entry(f"../{ESCAPE}")], "'..' component"),
    "nested-dot-dot": (
        lambda tmp: [dir_entry("a"), file_entry(f"a/../../{ESCAPE}")],
        "'..' component",
    ),
    # Links are data: any target is restored verbatim. What must never happen is an entry
    # created through one, whatever the link says.
    "absolute-symlink-then-file-under-it": (
        lambda tmp: [link_entry("out", parent_dir(tmp)), file_entry(f"out/{ESCAPE}")],
        "passes through 'out', which is a symlink",
    ),
    "absolute-symlink-then-dir-under-it": (
        lambda tmp: [link_entry("out", parent_dir(tmp)), dir_entry("out/d")],
        "passes through 'out', which is a symlink",
    ),
    "absolute-symlink-then-symlink-under-it": (
        lambda tmp: [link_entry("out", parent_dir(tmp)), link_entry(f"out/{ESCAPE}", "x")],
        "passes through 'out', which is a symlink",
    ),
    "absolute-symlink-then-hardlink-under-it": (
        lambda tmp: [
            file_entry("f"),
            link_entry("out", parent_dir(tmp)),
            link_entry(f"out/{ESCAPE}", "f", hard=True),
        ],
        "passes through 'out', which is a symlink",
    ),
    "symlink-to-etc-then-file-under-it": (
        lambda tmp: [link_entry("etc", "/etc"), file_entry(f"etc/{ETC_ESCAPE.name}")],
        "passes through 'etc', which is a symlink",
    ),
    "dot-dot-symlink-then-file-through-it": (
        lambda tmp: [link_entry("up", ".."), file_entry(f"up/{ESCAPE}")],
        "passes through 'up', which is a symlink",
    ),
    "deep-dot-dot-symlink-then-file-through-it": (
        lambda tmp: [dir_entry("a"), link_entry("a/up", "../.."), file_entry(f"a/up/{ESCAPE}")],
        "passes through 'a/up', which is a symlink",
    ),
    "chained-symlinks-then-file-through-them": (  # 'here' is '.', so 'here/..' is the parent
        lambda tmp: [
            link_entry("here", "."),
            link_entry("up", "here/.."),
            file_entry(f"up/{ESCAPE}"),
        ],
        "passes through 'up', which is a symlink",
    ),
    "dangling-absolute-symlink-then-file-of-its-name": (  # would write through the link
        lambda tmp: [link_entry("x", absolute_escape(tmp)), file_entry("x")],
        "already exists",
    ),
    "symlink-then-directory-of-its-name": (
        lambda tmp: [link_entry("etc", "/etc"), dir_entry("etc")],
        "already exists and is not a directory",
    ),
    "symlink-then-file-under-directory-of-its-name": (
        lambda tmp: [
            link_entry("etc", parent_dir(tmp)),
            dir_entry("etc"),
            file_entry(f"etc/{ESCAPE}"),
        ],
        "already exists and is not a directory",
    ),
    "symlink-with-empty-target": (
        lambda tmp: [link_entry("empty", "")],
        "invalid symlink target ''",
    ),
    "symlink-over-existing-file": (
        lambda tmp: [file_entry("f"), link_entry("f", "g")],
        "already exists",
    ),
    "hardlink-to-etc-passwd": (
        lambda tmp: [link_entry("pw", "/etc/passwd", hard=True)],
        "hard link target '/etc/passwd': absolute path",
    ),
    "hardlink-outside": (
        lambda tmp: [link_entry("s", "../sentinel.txt", hard=True)],
        "hard link target '../sentinel.txt': path contains a '..' component",
    ),
    "hardlink-to-later-member": (
        lambda tmp: [link_entry("h", "later.txt", hard=True), file_entry("later.txt")],
        "not an earlier file of the archive",
    ),
    "hardlink-to-symlink": (
        lambda tmp: [link_entry("l", "f"), link_entry("h", "l", hard=True)],
        "not an earlier file of the archive",
    ),
    "hardlink-to-absolute-path-outside": (
        lambda tmp: [link_entry("h", str(tmp / "parent/sentinel.txt"), hard=True)],
        "absolute path",
    ),
    "hardlink-through-absolute-symlink": (
        lambda tmp: [
            link_entry("out", parent_dir(tmp)),
            link_entry("h", "out/sentinel.txt", hard=True),
        ],
        "hard link to 'out/sentinel.txt', not an earlier file of the archive",
    ),
    "hardlink-through-dot-dot-symlink": (
        lambda tmp: [link_entry("up", ".."), link_entry("h", "up/sentinel.txt", hard=True)],
        "hard link to 'up/sentinel.txt', not an earlier file of the archive",
    ),
    "char-device": (
        lambda tmp: [special_entry("null", tarfile.CHRTYPE)],
        "a character device is not allowed",
    ),
    "block-device": (
        lambda tmp: [special_entry("sda", tarfile.BLKTYPE)],
        "a block device is not allowed",
    ),
    "fifo": (lambda tmp: [special_entry("pipe", tarfile.FIFOTYPE)], "a FIFO is not allowed"),
    "duplicate-file": (
        lambda tmp: [file_entry("a"), file_entry("a", b"overwrite")],
        "already exists",
    ),
    "file-as-parent": (
        lambda tmp: [file_entry("a"), file_entry("a/b")],
        "passes through 'a', which is not a",
    ),
    "file-named-dot": (lambda tmp: [file_entry("./")], "names the target directory itself"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_entry_is_rejected(tmp_path: Path, target: Path, case: str) -> None:
    entries, message = HOSTILE[case]
    error = refused(tmp_path, target, tar_bytes(entries(tmp_path)))
    assert isinstance(error, ArchiveRejected)
    assert message in str(error)
    assert str(error).startswith("entry ")


def test_pre_existing_symlink_in_the_target_is_not_followed(tmp_path: Path, target: Path) -> None:
    target.mkdir()
    os.symlink(target.parent, target / "out")
    error = refused(tmp_path, target, tar_bytes([file_entry(f"out/{ESCAPE}")]))
    assert "passes through 'out', which is a symlink" in str(error)


@pytest.mark.parametrize("format", FORMATS)
def test_hostile_entry_is_rejected_in_every_format(
    tmp_path: Path, target: Path, format: str
) -> None:
    stream = compress(tar_bytes([file_entry(f"../{ESCAPE}")]), format)
    error = refused(tmp_path, target, stream, format=format)
    assert isinstance(error, ArchiveRejected) and "'..' component" in str(error)


LIMITS: dict[str, tuple[Limits, list[Entry], str]] = {
    "entry-over-limit": (
        Limits(max_entry_bytes=100),
        [file_entry("big", b"x" * 101)],
        "'big': 101 bytes is over the entry limit of 100",
    ),
    "total-over-limit": (
        Limits(max_total_bytes=100),
        [file_entry("a", b"x" * 60), file_entry("b", b"x" * 60)],
        "'b': archive total exceeds the limit of 100 bytes",
    ),
    "too-many-entries": (
        Limits(max_entries=3),
        [dir_entry("d"), file_entry("d/1"), file_entry("d/2"), file_entry("d/3")],
        "'d/3': archive has more than 3 entries",
    ),
}


@pytest.mark.parametrize("case", LIMITS, ids=list(LIMITS))
def test_limit_is_enforced_before_writing(tmp_path: Path, target: Path, case: str) -> None:
    limits, entries, message = LIMITS[case]
    error = refused(tmp_path, target, tar_bytes(entries), limits=limits)
    assert isinstance(error, ArchiveRejected) and message in str(error)
    offending = message.split("'")[1]
    assert not (target / offending).exists()


def test_limits_are_inclusive(tmp_path: Path) -> None:
    stream = tar_bytes([file_entry("a", b"x" * 50), file_entry("b", b"x" * 50)])
    limits = Limits(max_entry_bytes=50, max_total_bytes=100, max_entries=2)
    assert unpack(io.BytesIO(stream), tmp_path / "out", format="none", limits=limits).bytes == 100


def test_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path, target: Path) -> None:
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 1 << 30  # claims a 1 GiB name
    stream = header.tobuf(tarfile.GNU_FORMAT) + b"a" * 4096
    error = refused(tmp_path, target, stream)
    assert isinstance(error, ArchiveRejected) and "extended tar header" in str(error)


def test_data_after_the_end_marker_is_bounded(tmp_path: Path, target: Path) -> None:
    stream = tar_bytes([file_entry("a")]) + b"\0" * (2 << 20)
    error = refused(tmp_path, target, compress(stream, "zstd"), format="zstd")
    assert isinstance(error, ArchiveRejected) and "after the end of the tar" in str(error)


# --- corrupt input -------------------------------------------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> dict[str, bytes]:
    """A small valid artifact of a few files, in every format."""
    source = tmp_path / "source"
    source.mkdir()
    for index in range(20):
        (source / f"file-{index:02d}.bin").write_bytes(os.urandom(20_000))
    result = {}
    for format in FORMATS:
        with pack(source, ArchiveOptions(format=format)) as stream:
            result[format] = stream.read()
    return result


def test_digest_mismatch_names_both_digests(
    tmp_path: Path, target: Path, archive: dict[str, bytes]
) -> None:
    wrong = "sha256:" + "0" * 64
    error = refused(tmp_path, target, archive["zstd"], format="zstd", expected_digest=wrong)
    actual = "sha256:" + hashlib.sha256(archive["zstd"]).hexdigest()
    assert isinstance(error, DigestMismatch)
    assert f"expected {wrong}, got {actual}" in str(error)


@pytest.mark.parametrize("format", FORMATS)
def test_truncated_stream_is_an_archive_error(
    tmp_path: Path, target: Path, archive: dict[str, bytes], format: str
) -> None:
    cut = archive[format][: len(archive[format]) // 2]
    error = refused(tmp_path, target, cut, format=format)
    assert not isinstance(error, ArchiveRejected)
    assert "truncated" in str(error) or "corrupt" in str(error)


def test_tar_cut_at_a_member_boundary_is_truncated(tmp_path: Path, target: Path) -> None:
    whole = tar_bytes([file_entry("a", b"x" * 512), file_entry("b", b"y" * 512)])
    error = refused(tmp_path, target, whole[:1024])  # header + data of "a", then nothing
    assert "truncated archive: the stream ends before the tar end marker" in str(error)


def test_truncated_stream_with_expected_digest_is_a_digest_mismatch(
    tmp_path: Path, target: Path, archive: dict[str, bytes]
) -> None:
    expected = "sha256:" + hashlib.sha256(archive["zstd"]).hexdigest()
    cut = archive["zstd"][:-1000]
    error = refused(tmp_path, target, cut, format="zstd", expected_digest=expected)
    assert isinstance(error, DigestMismatch) and f"expected {expected}" in str(error)
    assert isinstance(error.__cause__, ArchiveError)  # the corruption it explains


@pytest.mark.parametrize("format", FORMATS)
def test_garbage_bytes_are_an_archive_error(tmp_path: Path, target: Path, format: str) -> None:
    error = refused(tmp_path, target, os.urandom(64 * 1024), format=format)
    assert not isinstance(error, ArchiveRejected)
    assert "corrupt" in str(error)


@pytest.mark.parametrize("format", FORMATS)
def test_empty_stream_is_an_archive_error(tmp_path: Path, target: Path, format: str) -> None:
    error = refused(tmp_path, target, b"", format=format)
    assert "truncated" in str(error) or "corrupt" in str(error) or "empty" in str(error)


def test_flipped_byte_in_zstd_data_is_an_archive_error(
    tmp_path: Path, target: Path, archive: dict[str, bytes]
) -> None:
    damaged = bytearray(archive["zstd"])
    damaged[len(damaged) // 2] ^= 0xFF
    error = refused(tmp_path, target, bytes(damaged), format="zstd")
    assert "corrupt or truncated zstd stream" in str(error)


def _with_attributes(entry: Entry, **records: str) -> Entry:
    info, data = entry
    info.pax_headers = {f"SCHILY.xattr.{name}": value for name, value in records.items()}
    return info, data


@pytest.mark.skipif(os.geteuid() != 0, reason="only root could set these attributes at all")
def test_only_kept_extended_attributes_are_ever_set(tmp_path: Path) -> None:
    attributes = {
        "trusted.overlay.opaque": "y",
        "security.selinux": "system_u:object_r:shadow_t:s0",
        "security.ima": "forged",
        "system.posix_acl_access": "\x02\x00\x00\x00",
        "user.kept": "yes",
    }
    entries = [_with_attributes(file_entry("f"), **attributes)]
    entries.append(_with_attributes(dir_entry("d"), **attributes))
    unpack(io.BytesIO(tar_bytes(entries)), tmp_path / "out", format="none")
    for name in ("f", "d"):
        assert os.listxattr(tmp_path / "out" / name) == ["user.kept"]


def test_an_oversized_extended_attribute_is_refused(tmp_path: Path, target: Path) -> None:
    entry = _with_attributes(file_entry("f"), **{"user.big": "x" * 65537})
    error = refused(tmp_path, target, tar_bytes([entry]))
    assert "entry 'f': extended attribute 'user.big' is over 64 KiB" in str(error)


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a file capability needs root")
def test_a_malformed_file_capability_is_refused(tmp_path: Path, target: Path) -> None:
    entry = _with_attributes(file_entry("f"), **{"security.capability": "garbage"})
    error = refused(tmp_path, target, tar_bytes([entry]))
    assert isinstance(error, ArchiveRejected)
    assert "entry 'f': extended attribute 'security.capability': Invalid argument" in str(error)
