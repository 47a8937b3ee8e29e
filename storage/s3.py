"""S3 backend (AWS S3, MinIO, moto) on a boto3 S3 client that it is given.

Write-once is enforced by the server: a stream shorter than one part goes up in one
``PutObject`` and longer streams as a multipart upload, both with ``If-None-Match: *`` (on
``CompleteMultipartUpload`` for the latter), so the object appears atomically, only if the
key is free. A HEAD before a multipart upload saves uploading a stream that would be refused.
A multipart upload that fails or is interrupted for any reason (including
``KeyboardInterrupt`` and exceptions raised by the caller's stream) is aborted before the
exception propagates, so no parts linger. The sha256 of single-request objects is stored as
``x-amz-meta-sha256`` and reported by ``stat``; multipart objects cannot get it (metadata is
fixed when the upload starts, before the digest is known), so their ``stat`` digest is ``None``.

Records (``read_record``/``write_record``) are single ``PutObject`` requests conditional on
``If-None-Match: *`` (create) or ``If-Match: <ETag>`` (replace); S3, MinIO and versitygw
answer 412 (or 409 for a concurrent conditional write, 404 for a vanished key), all
``PreconditionFailed`` here. The ETag of a single-request object is the MD5 of its bytes.

Emulator gap: moto 5.2 checks ``If-None-Match`` on ``CompleteMultipartUpload`` without a lock,
so two *simultaneous* completions of one key can both succeed there; S3, MinIO and versitygw
(the tests' server) refuse one.

Retries of transient faults are botocore's (the client's retry configuration); every
botocore failure is translated by ``translate_error``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, BinaryIO

from botocore import exceptions as boto
from botocore.exceptions import BotoCoreError, ClientError

from storage.base import (
    MAX_RECORD_BYTES,
    HashingReader,
    ObjectInfo,
    Record,
    digest_from_hex,
    download_stream,
    read_full,
    readinto_full,
    record_too_large,
    validate_key,
    validate_prefix,
)
from storage.store_errors import (
    ObjectExists,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
    StoreUnavailable,
    retryable_status,
)
from storage.tuning import StoreOptions

log = logging.getLogger(__name__)

MAX_PARTS = 10_000  # the S3 limit on parts per multipart upload
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
# 409 ConditionalRequestConflict: a concurrent conditional write to the same key won.
_EXISTS = frozenset({"412", "PreconditionFailed", "ConditionalRequestConflict"})
_UNAVAILABLE = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "RequestTimeTooSkewed",
        "SignatureDoesNotMatch",
        "SlowDown",
    }
)
Parts = list[dict[str, Any]]  # the Parts of a CompleteMultipartUpload request
_TRANSPORT_ERRORS = (
    boto.ConnectionError,  # refused, DNS, connect timeout
    boto.HTTPClientError,  # read timeout, connection closed, broken download stream
    boto.IncompleteReadError,
    boto.NoCredentialsError,
    boto.PartialCredentialsError,
)


def translate_error(err: Exception, *, endpoint: str, bucket: str, name: str) -> StorageError:
    """The one mapping from a botocore failure to a storage error.

    Missing key → ``ObjectNotFound``; failed ``If-None-Match`` → ``ObjectExists``; missing
    bucket, refused credentials, throttling, 5xx and connection trouble → ``StoreUnavailable``
    naming the endpoint and bucket; anything else → ``StorageError``. Messages carry the S3
    error code and message, never credentials.
    """
    where = f"s3://{bucket}/{name} at {endpoint}"
    if not isinstance(err, ClientError):
        if isinstance(err, _TRANSPORT_ERRORS):
            return StoreUnavailable(f"{where}: {err}")
        return StorageError(f"{where}: {err}")
    error = err.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    detail = f"{code}: {error.get('Message') or 'no message'}"
    if code == "NoSuchBucket":
        return StoreUnavailable(f"S3 bucket {bucket!r} does not exist at {endpoint}")
    if code in _NOT_FOUND:
        return ObjectNotFound(f"s3://{bucket}/{name} does not exist")
    if code in _EXISTS or status == 412:
        return ObjectExists(f"s3://{bucket}/{name} already exists (objects are written once)")
    if code in _UNAVAILABLE or retryable_status(status):
        return StoreUnavailable(f"{where}: {detail}")
    return StorageError(f"{where}: {detail}")


class S3Store:
    """Objects under ``s3://<bucket>/<prefix>/`` through ``client`` (a boto3 S3 client).

    ``options.part_size`` sets the single-request threshold and the part size;
    ``options.concurrency`` the parts uploaded at once (the client's connection pool should
    hold that many connections per thread using the store: ``options.threads``). Thread-safe:
    boto3 clients are.
    """

    def __init__(
        self, client: Any, bucket: str, prefix: str = "", options: StoreOptions | None = None
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._options = options or StoreOptions()
        self.url = f"s3://{bucket}/{self._prefix}" if self._prefix else f"s3://{bucket}"

    def put(self, key: str, stream: BinaryIO) -> ObjectInfo:
        name = self._name(key)
        reader = HashingReader(stream)
        first = read_full(reader, self._options.part_size)
        with self._errors(name):
            if len(first) < self._options.part_size:
                self._put_single(name, first, reader.digest)
            else:
                self._put_multipart(name, first, reader)
        return ObjectInfo(key, reader.size, reader.digest)

    def open(self, key: str) -> BinaryIO:
        """One streaming GET (not ranged: S3-compatible servers serve a single GET fastest)."""
        name = self._name(key)
        with self._errors(name):
            body = self._client.get_object(Bucket=self._bucket, Key=name)["Body"]
        return download_stream(body, lambda: self._errors(name))

    def stat(self, key: str) -> ObjectInfo | None:
        name = self._name(key)
        try:
            with self._errors(name):
                head = self._client.head_object(Bucket=self._bucket, Key=name)
        except ObjectNotFound:
            self._check_bucket()
            return None
        digest = digest_from_hex(head.get("Metadata", {}).get("sha256"))
        return ObjectInfo(key, int(head["ContentLength"]), digest)

    def delete(self, key: str) -> None:
        name = self._name(key)
        with self._errors(name):
            self._client.delete_object(Bucket=self._bucket, Key=name)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self._list(validate_prefix(prefix))

    def url_for(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._name(key)}"

    def read_record(self, key: str) -> Record | None:
        name = self._name(key)
        try:
            with self._errors(name):
                got = self._client.get_object(Bucket=self._bucket, Key=name)
                data = got["Body"].read(MAX_RECORD_BYTES + 1)
                got["Body"].close()
        except ObjectNotFound:
            self._check_bucket()
            return None
        if len(data) > MAX_RECORD_BYTES:
            raise record_too_large(self.url_for(key))
        return Record(data, str(got["ETag"]))

    def write_record(self, key: str, data: bytes, token: str | None) -> str:
        name = self._name(key)
        if len(data) > MAX_RECORD_BYTES:
            raise record_too_large(self.url_for(key))
        condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        try:
            with self._errors(name):
                written = self._client.put_object(
                    Bucket=self._bucket, Key=name, Body=data, **condition
                )
        except (ObjectExists, ObjectNotFound) as err:
            state = "exists" if token is None else "changed since it was read"
            raise PreconditionFailed(f"s3://{self._bucket}/{name} {state}") from err
        return str(written["ETag"])

    def _name(self, key: str) -> str:
        validate_key(key)
        return f"{self._prefix}/{key}" if self._prefix else key

    def _list(self, prefix: str) -> Iterator[str]:
        base = f"{self._prefix}/" if self._prefix else ""
        pages = self._client.get_paginator("list_objects_v2")
        with self._errors(base + prefix):
            for page in pages.paginate(Bucket=self._bucket, Prefix=base + prefix):
                # S3 lists in UTF-8 byte order, which is Python's str order: no sort needed.
                yield from (item["Key"][len(base) :] for item in page.get("Contents", []))

    def _put_single(self, name: str, body: bytes, digest: str) -> None:
        self._client.put_object(
            Bucket=self._bucket,
            Key=name,
            Body=body,
            IfNoneMatch="*",
            Metadata={"sha256": digest.removeprefix("sha256:")},
        )

    def _put_multipart(self, name: str, first: bytes, reader: HashingReader) -> None:
        self._refuse_if_exists(name)
        created = self._client.create_multipart_upload(Bucket=self._bucket, Key=name)
        upload_id = created["UploadId"]
        try:
            parts = self._upload_parts(name, upload_id, first, reader)
            self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=name,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
        except BaseException:
            self._abort(name, upload_id)
            raise

    def _refuse_if_exists(self, name: str) -> None:
        """Fail before uploading a stream whose completion would be refused. Only a saving:
        a writer may still start after this check; ``If-None-Match`` decides at completion."""
        try:
            with self._errors(name):
                self._client.head_object(Bucket=self._bucket, Key=name)
        except ObjectNotFound:
            return
        raise ObjectExists(f"s3://{self._bucket}/{name} already exists (objects are written once)")

    def _upload_parts(
        self, name: str, upload_id: str, first: bytes, reader: HashingReader
    ) -> Parts:
        """Upload ``first`` and the rest of ``reader`` as parts, ``concurrency`` at a time.

        The next part is read while the others upload; the reader waits when ``concurrency``
        parts are in flight. Parts after the first are read into at most ``concurrency + 1``
        reused buffers, so memory is bounded by about ``(concurrency + 1) * part_size`` and
        no part is allocated (or copied) afresh: allocating and freeing part-sized blocks
        from several threads left the allocator holding ~35 MiB more at peak (measured).
        Returns the parts for ``CompleteMultipartUpload``; on any failure, waits for parts in
        flight and drops queued ones before re-raising, so an abort after it is final.
        """
        limit = self._options.concurrency
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="s3-part")
        buffers = _Buffers(self._options.part_size)
        pending: set[Future[dict[str, Any]]] = set()
        parts: Parts = []
        try:
            chunk: bytes | bytearray = first
            number = 1
            while chunk:
                if len(pending) >= limit:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    parts.extend(future.result() for future in done)
                pending.add(
                    pool.submit(self._upload_buffer, name, upload_id, number, chunk, buffers)
                )
                chunk, number = self._next_part(reader, number + 1, buffers)
            parts.extend(future.result() for future in wait(pending).done)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return sorted(parts, key=lambda part: part["PartNumber"])

    def _next_part(
        self, reader: HashingReader, number: int, buffers: _Buffers
    ) -> tuple[bytearray, int]:
        """The next part in a buffer of ``buffers``: full-sized, or a short last part copied
        out of it (the buffer goes back at once), or empty at the end of the stream."""
        buffer = buffers.take()
        size = readinto_full(reader, buffer)
        if size < len(buffer):
            chunk = buffer[:size]
            buffers.give(buffer)
        else:
            chunk = buffer
        if chunk and number > MAX_PARTS:
            buffers.give(chunk)
            limit = MAX_PARTS * self._options.part_size
            raise StorageError(
                f"stream longer than {MAX_PARTS} parts of {self._options.part_size} bytes "
                f"({limit} bytes): raise STORE_PART_SIZE"
            )
        return chunk, number

    def _upload_buffer(
        self, name: str, upload_id: str, number: int, body: bytes | bytearray, buffers: _Buffers
    ) -> dict[str, Any]:
        try:
            return self._upload_part(name, upload_id, number, body)
        finally:
            buffers.give(body)

    def _upload_part(
        self, name: str, upload_id: str, number: int, body: bytes | bytearray
    ) -> dict[str, Any]:
        with self._errors(name):
            uploaded = self._client.upload_part(
                Bucket=self._bucket, Key=name, UploadId=upload_id, PartNumber=number, Body=body
            )
        return {"PartNumber": number, "ETag": uploaded["ETag"]}

    def _abort(self, name: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=name, UploadId=upload_id)
        except Exception:
            # The failure being propagated matters more. An upload left behind is invisible
            # and is removed by an AbortIncompleteMultipartUpload lifecycle rule.
            log.warning(
                "could not abort multipart upload of s3://%s/%s", self._bucket, name, exc_info=True
            )

    def _check_bucket(self) -> None:
        """Raise ``StoreUnavailable`` if the bucket is missing: a 404 to HEAD object cannot
        tell a missing bucket from a missing key."""
        try:
            with self._errors(""):
                self._client.head_bucket(Bucket=self._bucket)
        except ObjectNotFound as err:
            raise StoreUnavailable(
                f"S3 bucket {self._bucket!r} does not exist at {self._endpoint}"
            ) from err

    @property
    def _endpoint(self) -> str:
        return str(self._client.meta.endpoint_url)

    @contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as err:
            raise translate_error(
                err, endpoint=self._endpoint, bucket=self._bucket, name=name
            ) from err


class _Buffers:
    """Reusable part buffers (bytearrays: botocore sends them as they are, with no copy).

    ``take`` returns a free buffer or allocates one; ``give`` returns one (other objects,
    such as the first part's ``bytes`` or a short last part, are ignored). Thread-safe: parts
    are given back by the upload threads."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(self._size)

    def give(self, buffer: bytes | bytearray) -> None:
        if isinstance(buffer, bytearray) and len(buffer) == self._size:
            with self._lock:
                self._free.append(buffer)
