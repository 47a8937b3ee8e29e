"""pack → unpack keeps a tree intact, in every format; pack is deterministic and streams."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from storage.archive import ArchiveOptions, pack, unpack
from storage.archive.pack import ustar_header
from storage.store_errors import ArchiveRejected
from tests.support.archive_trees import FORMATS, build_tree, describe, file_digest

MiB = 1 << 20


def packed(directory: Path, options: ArchiveOptions | None = None) -> bytes:
    with pack(directory, options or ArchiveOptions()) as stream:
        return stream.read()


def pack_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("archive-pack")]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "tree")


@pytest.mark.parametrize("format", FORMATS)
def test_round_trip_preserves_the_tree(tree: Path, tmp_path: Path, format: str) -> None:
    data = packed(tree, ArchiveOptions(format=format))
    stats = unpack(io.BytesIO(data), tmp_path / "out", format=format)

    assert describe(tmp_path / "out") == describe(tree)
    assert stats.size == len(data)
    assert stats.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert stats.entries == len(describe(tree))
    inodes = {
        p.lstat().st_ino: p.lstat().st_size
        for p in tree.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    assert stats.bytes == sum(inodes.values())  # a hard link's data is stored once


def test_names_that_are_not_utf8_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / os.fsdecode(b"latin1-\xe9t\xe9.txt")).write_bytes(b"x")
    os.symlink(os.fsdecode(b"latin1-\xe9t\xe9.txt"), source / os.fsdecode(b"link-\xff"))
    unpack(io.BytesIO(packed(source)), tmp_path / "out", format="zstd")
    assert describe(tmp_path / "out") == describe(source)


def test_unpacks_what_gnu_tar_writes(tree: Path, tmp_path: Path) -> None:
    archive = tmp_path / "gnu.tar.gz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(tree), "."], check=True)
    with archive.open("rb") as stream:
        unpack(stream, tmp_path / "out", format="gzip")
    assert describe(tmp_path / "out") == describe(tree)


def test_gnu_tar_reads_what_pack_writes(tree: Path, tmp_path: Path) -> None:
    archive = tmp_path / "ours.tar"
    archive.write_bytes(packed(tree, ArchiveOptions(format="none")))
    (tmp_path / "out").mkdir()
    subprocess.run(["tar", "xf", str(archive), "-C", str(tmp_path / "out")], check=True)
    assert describe(tmp_path / "out") == describe(tree)


def _member(name: str, type: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = type
    for field, value in fields.items():
        setattr(member, field, value)
    return member


@pytest.mark.parametrize(
    "member",
    [
        _member("a/file.txt", size=12345, mode=0o755, mtime=1_700_000_000),
        _member("a/dir", tarfile.DIRTYPE, mode=0o750, mtime=1),
        _member("a/link", tarfile.SYMTYPE, linkname="../b/c", mode=0o777),
        _member("a/hard", tarfile.LNKTYPE, linkname="a/file.txt"),
        _member("x" * 100, size=1),
        _member("empty", size=0, mtime=0),
        _member("setuid", size=3, mode=0o4755, uid=0, gid=0),
        _member("tmp", tarfile.DIRTYPE, mode=0o1777),
        _member("owned", size=1, mode=0o2750, uid=8**7 - 1, gid=65534),
        _member("abs-link", tarfile.SYMTYPE, linkname="/usr/share/zoneinfo/Etc/UTC"),
    ],
    ids=[
        "file",
        "directory",
        "symlink",
        "hard-link",
        "100-byte-name",
        "empty-file",
        "setuid",
        "sticky-directory",
        "owned-setgid",
        "absolute-symlink",
    ],
)
def test_fast_headers_are_the_ones_tarfile_writes(member: tarfile.TarInfo) -> None:
    assert ustar_header(member) == member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


@pytest.mark.parametrize(
    "member",
    [
        _member("x" * 101),
        _member("dir/" + "y" * 97, tarfile.DIRTYPE),
        _member("ünï"),
        _member("l", tarfile.SYMTYPE, linkname="z" * 101),
        _member("big", size=8**11),
        _member("big-uid", uid=8**7),
        _member("owner-name", uname="root"),
        _member("xattr", pax_headers={"SCHILY.xattr.user.a": "b"}),
    ],
    ids=[
        "101-byte-name",
        "dir-name-over-100-with-slash",
        "non-ascii",
        "long-link",
        "huge",
        "uid-over-7-octal-digits",
        "owner-name",
        "extended-attribute",
    ],
)
def test_entries_that_need_pax_records_get_no_fast_header(member: tarfile.TarInfo) -> None:
    assert ustar_header(member) is None


def test_hard_links_share_one_inode_after_unpack(tree: Path, tmp_path: Path) -> None:
    unpack(io.BytesIO(packed(tree)), tmp_path / "out", format="zstd")
    out = tmp_path / "out"
    inodes = {
        (out / name).stat().st_ino
        for name in ("hard/original.txt", "hard/second-name.txt", "small/d3/third-name.txt")
    }
    assert len(inodes) == 1


@pytest.mark.parametrize("format", FORMATS)
def test_large_file_round_trip(tmp_path: Path, format: str) -> None:
    source = tmp_path / "big"
    source.mkdir()
    big = source / "sparse.bin"
    with big.open("wb") as out:  # 128 MiB, mostly a hole: cheap to make, real bytes to move
        out.truncate(128 * MiB)
        for offset in (0, 77 * MiB + 5, 128 * MiB - 4096):
            out.seek(offset)
            out.write(os.urandom(4096))
    stats = unpack(
        io.BytesIO(packed(source, ArchiveOptions(format=format))), tmp_path / "out", format=format
    )
    assert file_digest(tmp_path / "out/sparse.bin") == file_digest(big)
    assert stats.bytes == 128 * MiB


@pytest.mark.parametrize("format", FORMATS)
def test_pack_twice_gives_identical_bytes(tree: Path, format: str) -> None:
    options = ArchiveOptions(format=format)
    assert packed(tree, options) == packed(tree, options)


def test_same_content_gives_same_bytes_whatever_atime_and_creation_order(
    tmp_path: Path,
) -> None:
    first = build_tree(tmp_path / "first")
    second = build_tree(tmp_path / "second", reverse=True)
    for path in second.rglob("*"):
        os.utime(path, ns=(123, path.lstat().st_mtime_ns), follow_symlinks=False)
    assert describe(first) == describe(second)
    assert packed(first) == packed(second)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_owners_are_content(tree: Path) -> None:
    before = packed(tree, ArchiveOptions(format="none"))
    os.chown(tree / "bin/run.sh", 1234, 5678)
    after = packed(tree, ArchiveOptions(format="none"))
    assert after != before
    with tarfile.open(fileobj=io.BytesIO(after)) as tar:
        member = tar.getmember("bin/run.sh")
    assert (member.uid, member.gid, member.uname, member.gname) == (1234, 5678, "", "")


def test_zstd_bytes_do_not_depend_on_the_thread_count(tree: Path) -> None:
    one = packed(tree, ArchiveOptions(threads=1))
    assert packed(tree, ArchiveOptions(threads=2)) == one
    assert packed(tree, ArchiveOptions(threads=0)) == one


def test_entries_are_relative_sorted_with_numeric_owners(tree: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(packed(tree, ArchiveOptions(format="none")))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert "small/d0/f000.txt" in names and "empty" in names and "nested/empty/deeper" in names
    assert not [n for n in names if n.startswith(("/", "./")) or ".." in n.split("/")]
    assert [n.split("/") for n in names] == sorted(n.split("/") for n in names)
    owners = {(m.uid, m.gid) for m in members}
    assert owners == {(info.st_uid, info.st_gid) for info in map(os.lstat, tree.rglob("*"))}
    assert {(m.uname, m.gname) for m in members} == {("", "")}
    assert {key for m in members for key in m.pax_headers} <= {"path", "linkpath"}
    link = next(m for m in members if m.name == "hard/second-name.txt")
    assert link.islnk() and link.linkname == "hard/original.txt"


def test_empty_directory_packs_to_an_empty_archive(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    stats = unpack(io.BytesIO(packed(tmp_path / "empty")), tmp_path / "out", format="zstd")
    assert stats.entries == 0 and list((tmp_path / "out").iterdir()) == []


@pytest.mark.timeout(60)
def test_closing_the_stream_early_stops_the_producer(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "random.bin").write_bytes(os.urandom(64 * MiB))
    with pack(source, ArchiveOptions(format="none")) as stream:
        assert len(stream.read(MiB)) == MiB
    assert not pack_threads()


@pytest.mark.timeout(60)
def test_an_exception_in_the_consumer_stops_the_producer(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "random.bin").write_bytes(os.urandom(64 * MiB))
    with pytest.raises(KeyError), pack(source) as stream:
        stream.read(MiB)
        raise KeyError("consumer failed")
    assert not pack_threads()


@pytest.mark.timeout(60)
def test_a_producer_error_is_raised_by_read_not_a_clean_end(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a-random.bin").write_bytes(os.urandom(8 * MiB))
    os.mkfifo(source / "z-fifo")  # sorted after the data: fails mid-stream
    received = 0
    options = ArchiveOptions(format="none")  # no compressor buffering: data flows at once
    with (
        pytest.raises(ArchiveRejected, match="'z-fifo': a FIFO cannot be archived"),
        pack(source, options) as stream,
    ):
        while chunk := stream.read(MiB):
            received += len(chunk)
    assert received >= 7 * MiB  # the pipe holds 1 MiB: the rest was read before the error
    assert not pack_threads()


def test_a_producer_error_is_raised_on_leaving_the_block(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    os.mkfifo(source / "fifo")
    with pytest.raises(ArchiveRejected, match="'fifo': a FIFO"), pack(source):
        time.sleep(0.1)
    assert not pack_threads()


def _make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


def _make_char_device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod of a device needs root")
    os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (os.mkfifo, "a FIFO cannot be archived"),
        (_make_socket, "a socket cannot be archived"),
        (_make_char_device, "a character device cannot be archived"),
    ],
    ids=["fifo", "socket", "char-device"],
)
def test_pack_refuses_what_unpack_would_refuse(tmp_path: Path, make, message: str) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    make(source / "sub/special")
    with pytest.raises(ArchiveRejected, match=message) as caught, pack(source) as stream:
        stream.read()
    assert "'sub/special'" in str(caught.value)


def test_pack_of_a_missing_directory_fails_before_streaming(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="not a directory"):
        pack(tmp_path / "missing")
