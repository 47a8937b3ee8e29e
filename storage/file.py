"""Directory backend: each object is a file under a root directory (``file:///abs/path``).

``put`` writes to ``.<name>.partial-<random>`` beside the target, fsyncs it, then hard-links
it to the target name. ``link`` fails if the name exists, so an object appears atomically
and only once, even with writers racing in other processes; the temp file is always removed.
The sha256 goes into the ``user.sha256`` extended attribute where the filesystem supports it
(then ``stat`` reports it). The root must exist (as a bucket must): a missing root raises
``StoreUnavailable``. A key cannot name an object and also be a "directory" of other keys.

Records (``read_record``/``write_record``): the token is the sha256 of the bytes. A write
holds an exclusive ``flock`` on the record's lock file ``.<name>.partial-lock`` (a reserved
name: never a key, never listed), compares the record's current bytes with the token, then
moves a complete, fsynced temp file into place (``link`` to create, so a racing ``put``
cannot be overwritten; ``rename`` to replace): readers take no lock and see old bytes or
new. ``flock`` excludes threads and processes alike (also over NFS, where Linux maps it to
POSIX locks). ``delete`` takes no lock: a delete racing a replace may be undone by it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat as stat_mode
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from storage.base import (
    MAX_RECORD_BYTES,
    PARTIAL_MARKER,
    HashingReader,
    ObjectInfo,
    Record,
    digest_from_hex,
    download_stream,
    record_too_large,
    validate_key,
    validate_prefix,
)
from storage.store_errors import (
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
    StoreUnavailable,
)

COPY_CHUNK = 1024 * 1024
DIGEST_XATTR = "user.sha256"
_ABSENT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def translate_error(err: OSError, *, root: Path, key: str) -> StorageError:
    """The one mapping from an ``OSError`` to a storage error. Absent paths are handled by the
    callers, which know whether absence means "no such object" or "no store"."""
    where = f"{root.as_uri()}/{key}"
    if err.errno == errno.ENAMETOOLONG:
        return InvalidKey(f"invalid object key {key!r}: a segment is too long for this filesystem")
    if isinstance(err, (FileExistsError, NotADirectoryError, IsADirectoryError)):
        return StorageError(f"{where}: a key cannot name an object and a prefix of keys here")
    return StoreUnavailable(f"{where}: {err.strerror or err}")


class FileStore:
    """Objects as files under ``root`` (an absolute path to an existing directory)."""

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)
        if not self._root.is_absolute():
            raise ValueError(f"file store root {str(root)!r} is not an absolute path")
        self.url = self._root.as_uri()

    def put(self, key: str, stream: BinaryIO) -> ObjectInfo:
        path = self._path(key)
        with self._errors(key):
            self._check_root()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{PARTIAL_MARKER}")
        try:
            reader = HashingReader(stream)
            with os.fdopen(fd, "wb") as out:
                self._copy(reader, out, key)
            self._link(temp, path, key)
        finally:
            with suppress(FileNotFoundError):
                os.unlink(temp)
        return ObjectInfo(key, reader.size, reader.digest)

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - returned; the caller closes it
        except _ABSENT:
            self._check_root()
            raise ObjectNotFound(f"{path.as_uri()} does not exist") from None
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err
        return download_stream(handle, lambda: self._errors(key))

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            info = path.stat()
        except _ABSENT:
            self._check_root()
            return None
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err
        if not stat_mode.S_ISREG(info.st_mode):
            return None  # a directory: a prefix of other keys, not an object
        return ObjectInfo(key, info.st_size, _read_digest(path))

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except _ABSENT:
            self._check_root()
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err

    def list(self, prefix: str = "") -> Iterator[str]:
        return self._list(validate_prefix(prefix))

    def url_for(self, key: str) -> str:
        return self._path(key).as_uri()

    def read_record(self, key: str) -> Record | None:
        data = self._read_record_bytes(key)
        return None if data is None else Record(data, _token(data))

    def write_record(self, key: str, data: bytes, token: str | None) -> str:
        path = self._path(key)
        if len(data) > MAX_RECORD_BYTES:
            raise record_too_large(self.url_for(key))
        with self._errors(key):
            self._check_root()
            path.parent.mkdir(parents=True, exist_ok=True)
        with self._record_lock(path, key):
            current = self._read_record_bytes(key)
            if (current is None) != (token is None) or (
                current is not None and _token(current) != token
            ):
                state = "exists" if token is None else "changed since it was read"
                raise PreconditionFailed(f"{path.as_uri()} {state}")
            self._replace(path, data, key, create=token is None)
        return _token(data)

    def _read_record_bytes(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_RECORD_BYTES + 1)
        except _ABSENT:
            self._check_root()
            return None
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err
        if len(data) > MAX_RECORD_BYTES:
            raise record_too_large(self.url_for(key))
        return data

    @contextmanager
    def _record_lock(self, path: Path, key: str) -> Iterator[None]:
        lock_path = path.with_name(f".{path.name}{PARTIAL_MARKER}lock")
        with self._errors(key):
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with self._errors(key):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _replace(self, path: Path, data: bytes, key: str, *, create: bool) -> None:
        """Put ``data`` at ``path`` whole: a fsynced temp file linked (``create``: only if the
        name is free) or renamed over the record."""
        with self._errors(key):
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{PARTIAL_MARKER}")
        try:
            with os.fdopen(fd, "wb") as out, self._errors(key):
                out.write(data)
                out.flush()
                os.fchmod(out.fileno(), 0o644)
                os.fsync(out.fileno())
            if create:
                self._link(temp, path, key)
            else:
                with self._errors(key):
                    os.replace(temp, path)
                    _fsync_directory(path.parent)
        except ObjectExists as err:  # a racing put took the name
            raise PreconditionFailed(f"{path.as_uri()} exists") from err
        finally:
            with suppress(FileNotFoundError):
                os.unlink(temp)

    def _path(self, key: str) -> Path:
        return self._root / validate_key(key)

    def _copy(self, reader: HashingReader, out: BinaryIO, key: str) -> None:
        # Only the writes are translated: the caller's stream raises its own errors.
        while data := reader.read(COPY_CHUNK):
            with self._errors(key):
                out.write(data)
        with self._errors(key):
            out.flush()
            _seal(out.fileno(), reader.digest)

    def _link(self, temp: str, path: Path, key: str) -> None:
        try:
            os.link(temp, path)  # fails if the name exists: the write-once guarantee
        except FileExistsError as err:
            if path.is_dir():
                raise translate_error(err, root=self._root, key=key) from err
            raise ObjectExists(
                f"{path.as_uri()} already exists (objects are written once)"
            ) from err
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err
        with self._errors(key):
            _fsync_directory(path.parent)

    def _list(self, prefix: str) -> Iterator[str]:
        self._check_root()
        directory = prefix.rpartition("/")[0]
        with self._errors(prefix):
            keys = self._walk(self._root / directory, f"{directory}/" if directory else "")
            yield from sorted(key for key in keys if key.startswith(prefix))

    def _walk(self, directory: Path, relative: str) -> Iterator[str]:
        """Keys of the regular files below ``directory``, skipping in-flight temp files."""
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path), f"{relative}{entry.name}/")
            elif entry.is_file(follow_symlinks=False) and not _is_partial(entry.name):
                yield f"{relative}{entry.name}"

    def _check_root(self) -> None:
        if not self._root.is_dir():
            raise StoreUnavailable(f"store directory {self._root} does not exist")

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            raise translate_error(err, root=self._root, key=key) from err


def _token(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_partial(name: str) -> bool:
    return name.startswith(".") and PARTIAL_MARKER in name


def _seal(fd: int, digest: str) -> None:
    """Record the digest, make the file read-only (objects are immutable) and flush it to disk
    before it gets its name, so a crash never leaves a named but incomplete object."""
    with suppress(OSError):  # no user xattrs here (some tmpfs, NFS): stat reports no digest
        os.setxattr(fd, DIGEST_XATTR, digest.removeprefix("sha256:").encode())
    os.fchmod(fd, 0o444)
    os.fsync(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_digest(path: Path) -> str | None:
    try:
        return digest_from_hex(os.getxattr(path, DIGEST_XATTR))
    except OSError:
        return None
