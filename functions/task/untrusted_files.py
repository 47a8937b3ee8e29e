"""Reading files that the resource image could have written: data, never paths to follow.

The resource container shares the build volume with ``collect``, which holds the store's
credentials. Anything there may be a symbolic link (to ``/proc/self/environ``, to the
mounted store Secret), a FIFO that blocks a reader forever, a device, or a sparse file of
any size. So each file is opened relative to a directory opened the same way, with
``O_NOFOLLOW`` (a link is refused, not followed) and ``O_NONBLOCK`` (opening a FIFO cannot
block), checked with ``fstat`` to be a regular file, and read for a bounded number of bytes.
Anything else raises ``UntrustedFile``, whose message names the file and never holds any of
its content.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UntrustedFile(Exception):
    """A file the resource step left is not a plain file to read (a link, a FIFO, …)."""


@contextmanager
def directory(parent: str, name: str) -> Iterator[int | None]:
    """An fd of the directory ``parent/name`` (``parent`` is ours, e.g. a mount point), or
    None if it does not exist; ``UntrustedFile`` if it is a link or not a directory."""
    path = os.path.join(parent, name)
    try:
        fd = os.open(path, _OPEN | os.O_DIRECTORY)
    except FileNotFoundError:
        yield None
        return
    except OSError as err:
        # O_DIRECTORY with O_NOFOLLOW reports a link as "not a directory": say which it is.
        linked = err.errno == errno.ENOTDIR and os.path.islink(path)
        raise UntrustedFile(_refusal(name, OSError(errno.ELOOP, "") if linked else err)) from None
    try:
        yield fd
    finally:
        os.close(fd)


def read_head(dir_fd: int | None, name: str, limit: int) -> bytes | None:
    """Up to ``limit`` bytes from the start of ``name`` in ``dir_fd``; None if absent."""
    return _read(dir_fd, name, limit, tail=False)


def read_tail(dir_fd: int | None, name: str, limit: int) -> bytes | None:
    """The last ``limit`` bytes of ``name`` in ``dir_fd`` (of a sparse file of any size too:
    it seeks, it never reads what it skips); None if absent."""
    return _read(dir_fd, name, limit, tail=True)


def mtime_ns(dir_fd: int | None, name: str) -> int | None:
    """When the regular file ``name`` in ``dir_fd`` was last written (never following a
    link); None if absent or not a regular file. A number the resource step may have set:
    for timings only."""
    if dir_fd is None:
        return None
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return info.st_mtime_ns if stat.S_ISREG(info.st_mode) else None


def _read(dir_fd: int | None, name: str, limit: int, *, tail: bool) -> bytes | None:
    if dir_fd is None:
        return None
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UntrustedFile(_refusal(name, err)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile(f"{name} is {_kind(info.st_mode)}, not a regular file")
        if tail and info.st_size > limit:
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        return _read_at_most(fd, limit)
    finally:
        os.close(fd)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _refusal(name: str, err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return f"{name} is a symbolic link (files the resource step leaves are never followed)"
    if err.errno == errno.ENOTDIR:
        return f"{name} is not a directory"
    return f"{name} cannot be read: {err.strerror}"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"
