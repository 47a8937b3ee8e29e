"""Helpers for the archive tests: build real trees, describe them, craft tar streams."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import zstandard

FORMATS = ("zstd", "gzip", "none")
Entry = tuple[tarfile.TarInfo, bytes | None]  # a crafted tar member and its data
OLD = 1_000_000_000  # 2001-09-09: a fixed, distinctive mtime


def build_tree(root: Path, *, reverse: bool = False) -> Path:
    """A tree with what artifacts hold: many small files, empty and nested directories,
    symlinks (to files, to dirs, dangling), hard links, exec and read-only modes, fixed mtimes,
    unicode and long names. ``reverse`` creates everything in the opposite order (so
    directory order on disk and inode numbers differ) but with the same content."""
    steps = _tree_steps(root)
    for step in reversed(steps) if reverse else steps:
        step()
    _fix_metadata(root)
    return root


def _tree_steps(root: Path) -> list[Any]:
    def write(name: str, data: bytes, mode: int = 0o644) -> Any:
        def step() -> None:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(mode)

        return step

    def mkdir(name: str) -> Any:
        return lambda: (root / name).mkdir(parents=True, exist_ok=True)

    def symlink(name: str, target: str) -> Any:
        def step() -> None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, root / name)

        return step

    steps = [
        write(f"small/d{i % 7}/f{i:03d}.txt", f"file {i}\n".encode() * (i % 13)) for i in range(150)
    ]
    steps += [
        mkdir("empty"),
        mkdir("nested/empty/deeper"),
        write("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
        write("bin/read-only.txt", b"do not touch\n", 0o444),
        write("ünïcødé/日本語.txt", "こんにちは\n".encode()),
        write("emoji-😀 and spaces.txt", b"smile\n"),
        write("long/" + "x" * 120 + "/" + "y" * 150 + ".txt", b"long name\n"),
        write("hard/original.txt", b"shared inode\n"),
    ]
    # Symlinks and hard links last in creation order (first when reversed: then they are
    # created before their targets, which a dangling symlink allows; hard links need the
    # target, so they are a separate final step either way).
    steps += [
        symlink("links/to-file", "../small/d0/f000.txt"),
        symlink("links/to-dir", "../small"),
        symlink("links/dangling", "missing-file"),
        symlink("links/here", "."),
    ]
    return steps


def _fix_metadata(root: Path) -> None:
    os.link(root / "hard/original.txt", root / "hard/second-name.txt")
    os.link(root / "hard/original.txt", root / "small/d3/third-name.txt")
    (root / "small/d1").chmod(0o750)
    for path in sorted(root.rglob("*"), reverse=True):  # children before their directories
        os.utime(path, (OLD + 12345, OLD + len(path.name)), follow_symlinks=False)


def describe(root: Path) -> dict[str, tuple[Any, ...]]:
    """What a round trip must preserve: type, mode, mtime, content or link target, and which
    files share an inode (as the name of the first path, in sorted order, with that inode)."""
    first_name: dict[int, str] = {}
    result: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        info = path.lstat()
        kind = stat.S_IFMT(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            content: Any = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            content = file_digest(path)
        else:
            content = None
        inode = first_name.setdefault(info.st_ino, name) if stat.S_ISREG(info.st_mode) else None
        mode = None if stat.S_ISLNK(info.st_mode) else stat.S_IMODE(info.st_mode)
        result[name] = (kind, mode, int(info.st_mtime), content, inode)
    return result


# security.capability value (VFS_CAP_REVISION_2, effective) granting cap_net_raw (bit 13), as
# `setcap cap_net_raw+ep` writes it: what ping carries in Debian images.
NET_RAW_CAPABILITY = bytes.fromhex("0100000200200000000000000000000000000000")


def build_rootfs(root: Path) -> Path:
    """A tree with what image root filesystems hold and ``build_tree`` does not: absolute and
    climbing symlinks, setuid, setgid and sticky bits, other owners (when root), extended
    attributes (kept and dropped ones), a read-only directory with contents, hard links."""
    for name in ("bin", "etc/alternatives", "usr/bin", "var/mail", "tmp", "ro", "empty"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "bin/busybox").write_bytes(b"\x7fELF not really\n" * 100)
    (root / "bin/busybox").chmod(0o755)
    os.symlink("/bin/busybox", root / "bin/sh")  # absolute, as in every busybox image
    os.symlink("../../bin/busybox", root / "usr/bin/env")
    os.symlink("/usr/share/zoneinfo/Etc/UTC", root / "etc/localtime")  # dangling here
    os.symlink("/etc/alternatives/editor", root / "usr/bin/editor")
    os.symlink("../../../../../../outside", root / "etc/alternatives/climbs")
    (root / "usr/bin/passwd").write_bytes(b"setuid root\n")
    (root / "usr/bin/passwd").chmod(0o4755)
    (root / "usr/bin/wall").write_bytes(b"setgid tty\n")
    (root / "usr/bin/wall").chmod(0o2755)
    os.link(root / "usr/bin/passwd", root / "bin/passwd-hard")
    (root / "tmp").chmod(0o1777)
    (root / "var/mail").chmod(0o2775)
    (root / "ro/inside.txt").write_bytes(b"in a read-only directory\n")
    (root / "ro").chmod(0o555)
    ping = root / "bin/ping"
    ping.write_bytes(b"ping\n")
    os.setxattr(ping, "user.comment", b"kept")
    os.setxattr(ping, "user.binary", bytes(range(256)))  # not UTF-8: travels as raw bytes
    if os.geteuid() == 0:
        os.setxattr(ping, "security.capability", NET_RAW_CAPABILITY)
        os.setxattr(ping, "trusted.dropped", b"not kept")
        os.chown(root / "etc/localtime", 1234, 5678, follow_symlinks=False)
        os.chown(root / "empty", 65534, 65534)
        for name, gid, mode in (("var/mail", 8, 0o2775), ("usr/bin/wall", 5, 0o2755)):
            os.chown(root / name, 0, gid)  # clears setgid: set the mode again
            (root / name).chmod(mode)
    os.setxattr(root / "etc", "user.dir-attribute", b"on a directory")
    for path in sorted(root.rglob("*"), reverse=True):
        os.utime(path, (OLD, OLD + len(path.name)), follow_symlinks=False)
    return root


def inventory(root: Path) -> dict[str, tuple[Any, ...]]:
    """Entry by entry, everything a root filesystem's round trip must keep: type, mode
    (special bits included), uid, gid, mtime, size, sha256 or link target, extended
    attributes (all of them, as read) and the hard-link group (its first name, in path
    order)."""
    entries: dict[str, tuple[Any, ...]] = {}
    names_of: dict[tuple[int, int], list[str]] = {}
    inode_of: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        info = path.lstat()
        kind = stat.S_IFMT(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            entries[name] = (kind, None, info.st_uid, info.st_gid, int(info.st_mtime))
            entries[name] += (None, None, os.readlink(path), None)
            continue
        regular = stat.S_ISREG(info.st_mode)
        entries[name] = (kind, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
        entries[name] += (int(info.st_mtime), info.st_size if regular else None)
        entries[name] += (file_digest(path) if regular else None, None, xattrs_of(path))
        if regular:
            inode_of[name] = (info.st_dev, info.st_ino)
            names_of.setdefault(inode_of[name], []).append(name)
    return {name: (*entry, _group(name, inode_of, names_of)) for name, entry in entries.items()}


def _group(
    name: str, inode_of: dict[str, tuple[int, int]], names_of: dict[tuple[int, int], list[str]]
) -> str | None:
    if name not in inode_of:
        return None
    return min(names_of[inode_of[name]], key=lambda n: n.split("/"))


def xattrs_of(path: Path) -> dict[str, bytes]:
    return {name: os.getxattr(path, name) for name in sorted(os.listxattr(path))}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def listing(root: Path, *, excluding: Path | None = None) -> dict[str, Any]:
    """Every path below ``root`` (not following symlinks), with content digests of files;
    the subtree ``excluding`` is left out."""
    result: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != excluding]
        for name in dirnames + filenames:
            path = here / name
            info = path.lstat()
            value: Any = stat.S_IFMT(info.st_mode)
            if stat.S_ISREG(info.st_mode):
                value = file_digest(path)
            elif stat.S_ISLNK(info.st_mode):
                value = ("symlink", os.readlink(path))
            result[path.relative_to(root).as_posix()] = value
    return result


# --- crafted tar streams ---------------------------------------------------------------------


def file_entry(name: str, data: bytes = b"data\n") -> Entry:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def dir_entry(name: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def link_entry(name: str, target: str, *, hard: bool = False) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


def special_entry(name: str, kind: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = kind, 1, 3
    return info, None


def tar_bytes(entries: list[Entry]) -> bytes:
    """A plain tar of ``entries``, written by tarfile exactly as given (no sanitising)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def compress(data: bytes, format: str) -> bytes:
    if format == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    if format == "gzip":
        return gzip.compress(data)
    return data
