"""The object store interface shared by every backend.

A store holds immutable objects under string keys (``artifacts/…``, ``results/…``,
``logs/…``) below the prefix of its URL. Contract for every backend:

* ``put`` consumes a binary stream of unknown length to its end and stores it under
  ``key`` only if no object exists there (write-once). The object becomes visible
  atomically when complete; a failed or interrupted upload leaves nothing visible.
  It returns the size and sha256 of the bytes stored.
* ``open`` returns a readable binary stream of the whole object; the caller closes it
  and may stop reading early.
* ``stat`` returns size (and digest where the backend recorded it) or ``None``.
* ``delete`` is idempotent; ``list`` yields keys (relative to the store prefix) in
  lexical order.
* Records: small objects that may change, under compare-and-swap. ``read_record`` returns
  the bytes with an opaque ``token`` naming that state (S3: the ETag; GCS: the generation;
  file store: the sha256 of the bytes), or ``None``. ``write_record(key, data, token)``
  creates the record when ``token`` is ``None`` and only if the key is free, else replaces
  it only if it still holds the state ``token`` names; it returns the new token, or raises
  ``PreconditionFailed`` and changes nothing. The write is atomic: readers see the old
  bytes or the new, never a mix. Tokens are only for ``write_record`` of the same key and
  store; ETag and sha256 tokens name the *bytes*, so a record rewritten with identical bytes
  still matches (a change computed from those bytes is still right). A write the client
  library retried may take effect and still report ``PreconditionFailed`` (the retry saw
  the first attempt's result): callers re-read and redo, so changes must be idempotent
  (``storage.compare_and_swap.update_record`` does that loop). Records and write-once objects share
  the key space: ``put`` refuses a record's key and creating a record refuses an object's.
* Backends retry transient faults themselves (via their client library) and raise
  ``storage.store_errors`` types, never the library's own.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from storage.store_errors import InvalidKey, StorageError


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    digest: str | None = None  # "sha256:<hex>" when known


MAX_RECORD_BYTES = 4 * 1024 * 1024  # records are small; a larger one is refused when read


@dataclass(frozen=True)
class Record:
    """A record's bytes and the opaque token of that state (for ``write_record``)."""

    data: bytes
    token: str


class Store(Protocol):
    url: str  # the store URL, e.g. s3://bucket/prefix

    def put(self, key: str, stream: BinaryIO) -> ObjectInfo: ...

    def open(self, key: str) -> BinaryIO: ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> Iterator[str]: ...

    def url_for(self, key: str) -> str: ...

    def read_record(self, key: str) -> Record | None: ...

    def write_record(self, key: str, data: bytes, token: str | None) -> str: ...


def readinto_via_read(read: Callable[[int], bytes], buffer: Any) -> int:
    """``readinto`` for a stream that only has ``read(n)``: fill ``buffer``'s head."""
    data = read(len(buffer))
    buffer[: len(data)] = data
    return len(data)


class HashingReader:
    """Wraps a readable stream; counts and sha256-hashes every byte read through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._hash.update(data)
        self.size += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer`` without an intermediate copy when the stream is a buffered
        ``io`` stream (others, e.g. wrappers that only have ``read``, are read and copied)."""
        view = memoryview(buffer).cast("B")
        if isinstance(self._stream, io.BufferedIOBase):
            count = self._stream.readinto(view) or 0
        else:
            data = self._stream.read(len(view))
            count = len(data)
            view[:count] = data
        self._hash.update(view[:count])
        self.size += count
        return count

    def readable(self) -> bool:
        return True

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


def url_prefix(store: Store) -> str:
    """What every object URL of ``store`` starts with: ``url_for(key) == prefix + key``."""
    return store.url.rstrip("/") + "/"


def key_for_url(store: Store, url: str) -> str | None:
    """The key of an object URL of ``store``, or None if the URL is not one of its objects."""
    prefix = url_prefix(store)
    if not url.startswith(prefix) or key_problem(url[len(prefix) :]) is not None:
        return None
    return url[len(prefix) :]


def record_too_large(key: str) -> StorageError:
    """The error of a record over ``MAX_RECORD_BYTES`` (read or written), for every backend."""
    return StorageError(f"record {key} is larger than {MAX_RECORD_BYTES} bytes")


def put_json(store: Store, key: str, value: Any) -> ObjectInfo:
    """Store ``value`` as a compact JSON object (write-once)."""
    import io

    body = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return store.put(key, io.BytesIO(body))


def get_json(store: Store, key: str, *, limit: int = 16 * 1024 * 1024) -> Any:
    """Read a JSON object written by ``put_json``; refuses bodies over ``limit`` bytes."""
    with store.open(key) as stream:
        body = stream.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"{key}: JSON object larger than {limit} bytes")
    return json.loads(body)


# --- helpers shared by the backends -------------------------------------------------------

MAX_KEY_BYTES = 1024  # the S3 and GCS limit on object names
PARTIAL_MARKER = ".partial-"  # the file backend names in-flight uploads ".<name>.partial-<random>"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # the one spelling of a digest, for every layer


def validate_key(key: str) -> str:
    """Return ``key`` unchanged if every backend can store it, else raise ``InvalidKey``.

    A key is 1 to 1024 UTF-8 bytes of ``/``-separated segments. No segment is empty, ``.`` or
    ``..`` (so no leading or trailing ``/``), no character is a control character or a
    backslash, and no segment looks like the file backend's temp files (``.<x>.partial-<y>``).
    The same rules hold for every backend, so a key that works on ``file://`` works on S3/GCS.
    """
    problem = key_problem(key)
    if problem:
        raise InvalidKey(f"invalid object key {key!r}: {problem}")
    return key


def validate_prefix(prefix: str) -> str:
    """Return a ``list`` prefix unchanged if valid: empty, or a key with an optional final ``/``."""
    problem = key_problem(prefix.removesuffix("/")) if prefix else None
    if problem:
        raise InvalidKey(f"invalid key prefix {prefix!r}: {problem}")
    return prefix


def key_problem(key: object) -> str | None:
    """What makes ``key`` unusable as an object key (see ``validate_key``), or ``None``."""
    if not isinstance(key, str) or not key:
        return "keys are non-empty strings"
    try:
        if len(key.encode("utf-8")) > MAX_KEY_BYTES:
            return f"longer than {MAX_KEY_BYTES} bytes"
    except UnicodeEncodeError:
        return "not encodable as UTF-8"
    if key.startswith("/"):
        return "keys are relative to the store (no leading '/')"
    if any(ch < " " or ch in "\x7f\\" for ch in key):
        return "control characters and backslashes are not allowed"
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            return "empty, '.' and '..' path segments are not allowed"
        if segment.startswith(".") and PARTIAL_MARKER in segment:
            return f"segments like '.<name>{PARTIAL_MARKER}<x>' are reserved for in-flight uploads"
    return None


def digest_from_hex(value: object) -> str | None:
    """``sha256:<hex>`` from a digest recorded as 64 hex digits in object metadata, else ``None``."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and is_digest(f"sha256:{value}"):
        return f"sha256:{value}"
    return None


def is_digest(value: object) -> bool:
    """Whether ``value`` is a digest as this project writes them: ``sha256:`` and 64
    lower-case hex digits, nothing else (no surrounding space, no newline)."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def read_full(stream: Any, size: int) -> bytes:
    """Read ``size`` bytes from ``stream``; fewer only at end of stream.

    ``read(n)`` on pipes, sockets and decompressors may return short; this loops until the
    part is complete so that part boundaries never depend on how the producer chunks its output.
    """
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        data = stream.read(remaining)
        if not data:
            break
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


def readinto_full(stream: Any, buffer: Any) -> int:
    """Fill ``buffer`` from ``stream.readinto``; fewer bytes only at end of stream. The
    counterpart of ``read_full`` for a reused buffer."""
    view = memoryview(buffer).cast("B")
    filled = 0
    while filled < len(view):
        count = stream.readinto(view[filled:])
        if not count:
            break
        filled += count
    return filled


class TranslatingReader(io.RawIOBase):
    """A read-only stream over a backend's download stream that raises only storage errors.

    ``errors`` is the backend's error-translating context manager factory; every read runs
    inside it, so a connection lost mid-download surfaces as ``StoreUnavailable``.
    """

    def __init__(self, stream: Any, errors: Callable[[], AbstractContextManager[None]]) -> None:
        super().__init__()
        self._stream = stream
        self._errors = errors

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        with self._errors():
            data: bytes = (
                self._stream.read() if size is None or size < 0 else self._stream.read(size)
            )
        return data

    def readinto(self, buffer: Any) -> int:
        return readinto_via_read(self.read, buffer)

    def close(self) -> None:
        if self.closed:
            return
        try:
            with self._errors():
                self._stream.close()
        finally:
            super().close()


def download_stream(stream: Any, errors: Callable[[], AbstractContextManager[None]]) -> BinaryIO:
    """Wrap a backend's download stream for callers: buffered, closeable, storage errors only."""
    return io.BufferedReader(TranslatingReader(stream, errors), buffer_size=1024 * 1024)
