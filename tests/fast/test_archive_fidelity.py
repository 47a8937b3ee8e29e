"""What a resource wrote comes back exactly (root filesystems included), and packing, done by a
process holding store credentials over a tree an untrusted image wrote, reads nothing
through a link."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from storage.archive import ArchiveOptions, pack, unpack
from storage.archive.pack import _open_entry
from storage.store_errors import ArchiveRejected
from tests.support.archive_trees import (
    FORMATS,
    NET_RAW_CAPABILITY,
    build_rootfs,
    inventory,
    xattrs_of,
)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="owners and capabilities need root")
NOBODY = 65534


def packed(directory: Path, format: str = "none") -> bytes:
    with pack(directory, ArchiveOptions(format=format)) as stream:
        return stream.read()


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tar:
        return {member.name: member for member in tar.getmembers()}


def without_dropped_attributes(entries: dict[str, tuple]) -> dict[str, tuple]:
    """``entries`` as extraction must give them: ``trusted.*`` attributes are not kept."""
    result = {}
    for name, entry in entries.items():
        attributes = entry[8]
        if attributes is not None:
            attributes = {k: v for k, v in attributes.items() if not k.startswith("trusted.")}
        result[name] = (*entry[:8], attributes, entry[9])
    return result


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return build_rootfs(tmp_path / "rootfs")


# --- round trips ---------------------------------------------------------------------------


@as_root
@pytest.mark.parametrize("format", FORMATS)
def test_root_filesystem_round_trips_entry_by_entry(
    rootfs: Path, tmp_path: Path, format: str
) -> None:
    unpack(io.BytesIO(packed(rootfs, format)), tmp_path / "out", format=format)
    expected = without_dropped_attributes(inventory(rootfs))
    assert inventory(tmp_path / "out") == expected
    assert xattrs_of(tmp_path / "out/bin/ping")["security.capability"] == NET_RAW_CAPABILITY
    assert os.lstat(tmp_path / "out/usr/bin/passwd").st_mode & 0o7777 == 0o4755


def test_symlinks_are_stored_verbatim_whatever_their_target(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    targets = {
        "absolute": "/etc/passwd",
        "sub/climbs-out": "../../../../outside",
        "dangling": "no/such/file",
        "climb-after-name": "sub/../..",
        "environ": "/proc/self/environ",
        "dot-dot": "..",
    }
    for name, target in targets.items():
        os.symlink(target, source / name)
    entries = members(packed(source))
    assert {name: entries[name].linkname for name in targets} == targets
    assert all(entries[name].issym() for name in targets)
    unpack(io.BytesIO(packed(source, "zstd")), tmp_path / "out", format="zstd")
    assert {name: os.readlink(tmp_path / "out" / name) for name in targets} == targets


def test_special_bits_and_extended_attributes_are_in_the_tar(rootfs: Path) -> None:
    entries = members(packed(rootfs))
    assert entries["usr/bin/passwd"].mode == 0o4755
    assert entries["usr/bin/wall"].mode == 0o2755
    assert entries["tmp"].mode == 0o1777
    assert entries["bin/passwd-hard"].isreg()  # the first name, in sorted order
    assert entries["usr/bin/passwd"].islnk()
    assert entries["usr/bin/passwd"].linkname == "bin/passwd-hard"
    ping = entries["bin/ping"].pax_headers
    assert ping["SCHILY.xattr.user.comment"] == "kept"
    raw = ping["SCHILY.xattr.user.binary"].encode("utf-8", "surrogateescape")
    assert raw == bytes(range(256))
    assert not [key for key in ping if key.startswith("SCHILY.xattr.trusted.")]
    if os.geteuid() == 0:
        capability = ping["SCHILY.xattr.security.capability"]
        assert capability.encode("utf-8", "surrogateescape") == NET_RAW_CAPABILITY
        assert (entries["var/mail"].uid, entries["var/mail"].gid) == (0, 8)


@as_root
def test_gnu_tar_restores_what_pack_writes(rootfs: Path, tmp_path: Path) -> None:
    archive = tmp_path / "ours.tar"
    archive.write_bytes(packed(rootfs))
    (tmp_path / "out").mkdir()
    command = ["tar", "--xattrs", "--xattrs-include=*", "--same-owner", "-xpf", str(archive)]
    subprocess.run([*command, "-C", str(tmp_path / "out")], check=True)
    assert inventory(tmp_path / "out") == without_dropped_attributes(inventory(rootfs))


@as_root
@pytest.mark.parametrize("format", ["none", "zstd"])
def test_bsdtar_restores_what_pack_writes(rootfs: Path, tmp_path: Path, format: str) -> None:
    archive = tmp_path / "ours.tar"
    archive.write_bytes(packed(rootfs, format))
    (tmp_path / "out").mkdir()
    command = ["bsdtar", "--xattrs", "--same-owner", "--numeric-owner", "-xpf", str(archive)]
    subprocess.run([*command, "-C", str(tmp_path / "out")], check=True)
    assert inventory(tmp_path / "out") == without_dropped_attributes(inventory(rootfs))


@as_root
def test_what_gnu_tar_writes_of_a_root_filesystem_round_trips(rootfs: Path, tmp_path: Path) -> None:
    archive = tmp_path / "gnu.tar"
    command = ["tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-cf", str(archive)]
    subprocess.run([*command, "-C", str(rootfs), "."], check=True)
    with archive.open("rb") as stream:
        unpack(stream, tmp_path / "out", format="none")
    assert inventory(tmp_path / "out") == without_dropped_attributes(inventory(rootfs))


def unpack_as(uid: int, data: bytes, directory: Path) -> None:
    """``unpack`` in a child process that dropped root for ``uid`` (the interpreter itself
    may not be readable by that user, so fork rather than exec)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            unpack(io.BytesIO(data), directory, format="none")
            status = 0
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            os.write(write_end, repr(err).encode()[:4000])
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as errors:
        message = errors.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, message


@as_root
def test_unprivileged_extraction_keeps_modes_and_ignores_owners(
    rootfs: Path, tmp_path: Path
) -> None:
    """As tar does: not root, the files are the extracting user's; modes stay whole; what
    the system refuses to a user (a file capability) is dropped, not an error."""
    out = Path(tempfile.mkdtemp(prefix="rf-unprivileged-"))  # /tmp: the user can reach it
    try:
        os.chown(out, NOBODY, NOBODY)
        unpack_as(NOBODY, packed(rootfs), out / "tree")
        got = inventory(out / "tree")
        attributes = xattrs_of(out / "tree/bin/ping")
    finally:
        shutil.rmtree(out)
    source = inventory(rootfs)
    assert {entry[2:4] for entry in got.values()} == {(NOBODY, NOBODY)}
    assert {name: entry[1] for name, entry in got.items()} == {
        name: entry[1] for name, entry in source.items()
    }
    assert attributes == {
        "user.binary": bytes(range(256)),
        "user.comment": b"kept",
    }


# --- packing reads nothing through a link --------------------------------------------------


def test_an_output_directory_that_is_a_symlink_is_refused_unread(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text("store credentials")
    os.symlink(secrets, tmp_path / "get")
    with pytest.raises(ArchiveRejected) as caught:
        pack(tmp_path / "get")
    assert f"{str(tmp_path / 'get')!r}: it is a symlink, not a directory" in str(caught.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("archive-pack")]


def test_a_link_to_a_secret_is_stored_as_a_link_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "rf-canary-3c1f8a0e-store-credential"
    monkeypatch.setenv("RF_TEST_CANARY", canary)  # in this process's /proc/self/environ
    outside = tmp_path / "outside.txt"
    outside.write_text(f"outside the tree: {canary}\n")
    source = tmp_path / "get"
    (source / "dir").mkdir(parents=True)
    os.symlink("/proc/self/environ", source / "environ")
    os.symlink(outside, source / "dir/outside")
    os.symlink("../../outside.txt", source / "dir/relative-outside")
    os.symlink(tmp_path, source / "dir/parent-directory")
    data = packed(source)
    assert canary.encode() not in data
    entries = members(data)
    assert entries["environ"].linkname == "/proc/self/environ"
    assert entries["dir/outside"].linkname == str(outside)
    assert entries["dir/relative-outside"].linkname == "../../outside.txt"
    assert entries["dir/parent-directory"].issym()
    assert sorted(entries) == [
        "dir",
        "dir/outside",
        "dir/parent-directory",
        "dir/relative-outside",
        "environ",
    ]


def _entry_then_swap(tmp_path: Path, make: str, swap) -> ArchiveRejected:
    """A directory entry read while ``make`` was a file or a directory, then ``swap``-ed
    before packing opens it (what a writer racing the walk could do)."""
    directory = tmp_path / "tree"
    directory.mkdir()
    path = directory / "entry"
    path.mkdir() if make == "dir" else path.write_text("plain")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as entries:
            (entry,) = list(entries)
        assert entry.is_dir() if make == "dir" else entry.is_file()  # d_type is cached
        path.rmdir() if make == "dir" else path.unlink()
        swap(path)
        with pytest.raises(ArchiveRejected) as caught:
            _open_entry("entry", fd, entry, {})
    finally:
        os.close(fd)
    return caught.value


@pytest.mark.timeout(20)
def test_a_fifo_swapped_in_for_a_file_is_refused_without_blocking(tmp_path: Path) -> None:
    error = _entry_then_swap(tmp_path, "file", os.mkfifo)
    assert "'entry': a FIFO cannot be archived" in str(error)


@pytest.mark.parametrize("make", ["file", "dir"])
def test_a_symlink_swapped_in_is_not_followed(tmp_path: Path, make: str) -> None:
    (tmp_path / "secret").mkdir()
    error = _entry_then_swap(tmp_path, make, lambda p: os.symlink(tmp_path / "secret", p))
    assert "'entry': changed while it was packed" in str(error)


def test_a_refused_pack_leaves_no_descriptor_open(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "a/b/c").mkdir(parents=True)
    (source / "a/b/c/file").write_text("x")
    os.mkfifo(source / "a/b/c/z-fifo")  # refused deep in the walk, with directories open
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(ArchiveRejected, match="'a/b/c/z-fifo': a FIFO"), pack(source) as stream:
        stream.read()
    assert sorted(os.listdir("/proc/self/fd")) == before
