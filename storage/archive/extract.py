"""Writes tar entries below one directory without ever leaving it.

Every path is walked component by component from a descriptor of the target directory with
``O_NOFOLLOW`` (``openat``), and every leaf is created relative to its parent's descriptor
with exclusive-create flags. So nothing is written through a symlink, whether extracted
earlier or already present, nothing existing is replaced, and path length is not limited
by ``PATH_MAX``. That is what makes any symlink target safe to restore verbatim (an
absolute one, ``..``): a link is created, never entered. Names are vetted by
``archive.safety`` first.

What is restored: contents, modes with setuid, setgid and sticky, mtimes, symlinks, hard
links, the extended attributes ``archive.xattrs`` keeps, and numeric owners when running as
root (as tar does; otherwise files belong to the extracting user).
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from typing import IO, Any, Self

from storage.archive import xattrs
from storage.archive.pipe import write_all
from storage.archive.safety import check_kind, check_symlink, member_parts, rejected

# tarfile's stream reader joins and slices what it returns: 1 MiB reads made two 1 MiB
# allocations per MiB, which grew and trimmed the heap each time (4,000 brk calls and page
# faults for 512 MiB: +1 s system time, the file store's download slower than S3's, whose
# process had heap to spare). 64 KiB reads stay inside the heap (measured: sys 2.2 -> 1.05 s).
_COPY_BYTES = 64 << 10
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Failures caused by the archive's content rather than by the machine (full disk, EIO).
_CONTENT_ERRNOS = frozenset({errno.EEXIST, errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL})


class SafeWriter:
    """Extracts members of a tar stream, in order, below ``directory`` (created if missing).

    Use as a context manager and call ``finish`` after the last member: directory owners,
    modes and mtimes are applied last, deepest first, so read-only directories and mtimes
    survive their own contents being written. Modes are kept whole (``0o7777``); owners are
    restored when this process is root (``restore_owners``), where the system allows it.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, restore_owners: bool | None = None
    ) -> None:
        os.makedirs(directory, exist_ok=True)
        self._root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._cached: tuple[tuple[str, ...], int] = ((), self._root)
        self._files: set[tuple[str, ...]] = set()  # hard links may only point at these
        self._dirs: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
        self._owners = os.geteuid() == 0 if restore_owners is None else restore_owners

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._set_cache((), self._root)
        os.close(self._root)

    def extract(self, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        """Create ``member``; file data is read from ``tar``, which must be positioned on it."""
        check_kind(member)
        parts = member_parts(member.name)
        if not parts:
            if member.isdir():
                return  # "./": the target directory itself, which already exists
            raise rejected(member.name, "entry names the target directory itself")
        parent = self._parent(parts, member.name)
        try:
            self._create(member, parts, parent, tar)
        except OSError as err:
            if err.errno not in _CONTENT_ERRNOS:
                raise
            reason = "already exists" if err.errno == errno.EEXIST else str(err.strerror)
            raise rejected(member.name, reason) from err

    def finish(self) -> None:
        """Apply directory owners, modes and mtimes, deepest first: a parent made read-only
        (or unsearchable, or someone else's) must not block its children, whatever the
        archive's order."""
        for parts, member in sorted(self._dirs, key=lambda d: len(d[0]), reverse=True):
            fd = self._walk(parts, create=False, name=member.name)
            try:
                self._chown(member, fd)
                os.fchmod(fd, _permissions(member))
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)

    def _create(
        self, member: tarfile.TarInfo, parts: tuple[str, ...], parent: int, tar: tarfile.TarFile
    ) -> None:
        leaf = parts[-1]
        if member.isdir():
            self._mkdir(member, leaf, parent)
            self._dirs.append((parts, _directory_part(member)))
        elif member.issym():
            check_symlink(member.name, member.linkname)
            os.symlink(member.linkname, leaf, dir_fd=parent)
            if self._owners:
                _ignore_refusal(
                    os.chown, leaf, member.uid, member.gid, dir_fd=parent, follow_symlinks=False
                )
            os.utime(leaf, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            self._link(member, leaf, parent)
        else:
            source = tar.extractfile(member)
            assert source is not None  # regular members always have data
            self._write_file(member, leaf, parent, source)
            self._files.add(parts)

    def _mkdir(self, member: tarfile.TarInfo, leaf: str, parent: int) -> None:
        """Make the directory (or take the one an earlier entry implied) and set its extended
        attributes now, while it is still ours and writable."""
        attributes = _attributes(member)
        try:
            os.mkdir(leaf, 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(leaf, dir_fd=parent, follow_symlinks=False).st_mode):
                raise rejected(member.name, "already exists and is not a directory") from None
        if attributes:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent)
            try:
                xattrs.restore(fd, attributes)
            finally:
                os.close(fd)

    def _write_file(
        self, member: tarfile.TarInfo, leaf: str, parent: int, source: IO[bytes]
    ) -> None:
        attributes = _attributes(member)
        fd = os.open(leaf, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            remaining = member.size
            while remaining:
                chunk = source.read(min(remaining, _COPY_BYTES))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                write_all(fd, chunk)
                remaining -= len(chunk)
            # This order: chown clears setuid, setgid and file capabilities; a 0444 mode
            # would stop an unprivileged owner from setting user attributes.
            self._chown(member, fd)
            xattrs.restore(fd, attributes)
            os.fchmod(fd, _permissions(member))
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)

    def _chown(self, member: tarfile.TarInfo, fd: int) -> None:
        if self._owners:
            _ignore_refusal(os.fchown, fd, member.uid, member.gid)

    def _link(self, member: tarfile.TarInfo, leaf: str, parent: int) -> None:
        target = member_parts(member.linkname, entry=member.name)
        if target not in self._files:
            raise rejected(
                member.name, f"hard link to {member.linkname!r}, not an earlier file of the archive"
            )
        source_dir = self._walk(target[:-1], create=False, name=member.linkname)
        try:
            os.link(
                target[-1], leaf, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False
            )
        finally:
            if source_dir != self._root:
                os.close(source_dir)

    def _parent(self, parts: tuple[str, ...], name: str) -> int:
        """Descriptor of the parent directory of ``parts``, creating missing directories.

        Archives are sorted, so consecutive entries usually share a parent: keep the last one
        open. It stays valid because nothing extracted later can replace a directory.
        """
        wanted = parts[:-1]
        if self._cached[0] != wanted:
            self._set_cache(wanted, self._walk(wanted, create=True, name=name))
        return self._cached[1]

    def _set_cache(self, parts: tuple[str, ...], fd: int) -> None:
        if self._cached[1] != self._root:
            os.close(self._cached[1])
        self._cached = (parts, fd)

    def _walk(self, parts: tuple[str, ...], *, create: bool, name: str) -> int:
        """Open the directory ``parts`` without following any symlink; caller closes it."""
        fd = self._root
        for depth, part in enumerate(parts):
            try:
                child = _open_dir(part, fd, create)
            except OSError as err:
                raise _walk_error(err, part, fd, name, parts[: depth + 1]) from err
            finally:
                if fd != self._root:
                    os.close(fd)
            fd = child
        return fd


def _open_dir(part: str, parent: int, create: bool) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    os.mkdir(part, 0o777, dir_fd=parent)  # implicit parent: default mode, as tar does
    return os.open(part, _DIR_FLAGS, dir_fd=parent)


def _walk_error(
    err: OSError, part: str, parent: int, name: str, prefix: tuple[str, ...]
) -> Exception:
    """Explain why ``prefix`` could not be entered: a symlink or a non-directory is hostile."""
    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
        return err
    kind = "not a directory"
    try:
        if stat.S_ISLNK(os.stat(part, dir_fd=parent, follow_symlinks=False).st_mode):
            kind = "a symlink"
    except OSError:
        pass
    return rejected(name, f"path passes through {'/'.join(prefix)!r}, which is {kind}")


def _permissions(member: tarfile.TarInfo) -> int:
    return member.mode & 0o7777


def _attributes(member: tarfile.TarInfo) -> list[tuple[str, bytes]]:
    attributes = xattrs.of_member(member) if member.pax_headers else []
    too_big = xattrs.oversized(attributes)
    if too_big:
        raise rejected(member.name, f"extended attribute {too_big!r} is over 64 KiB")
    return attributes


def _directory_part(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What ``finish`` needs of a directory: not its PAX records, which may be large."""
    kept = tarfile.TarInfo(member.name)
    kept.mode, kept.mtime = member.mode, member.mtime
    kept.uid, kept.gid = member.uid, member.gid
    return kept


def _ignore_refusal(chown: Any, *args: Any, **kwargs: Any) -> None:
    """chown, unless the system refuses: no CAP_CHOWN, or an id this user namespace lacks."""
    try:
        chown(*args, **kwargs)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EINVAL):
            raise
