"""Google Cloud Storage backend on a ``google.cloud.storage.Client`` that it is given.

Write-once is ``if_generation_match=0``. A stream shorter than one chunk goes up in a single
request that also carries the sha256 as custom metadata (``metadata.sha256``). Longer
streams use a resumable upload of ``part_size`` chunks (rounded up to a multiple of 256 KiB)
that GCS checks against the precondition when it finalizes; the session is cancelled if the
upload fails or is interrupted, so nothing becomes visible. Before a resumable upload the
key is checked once, which saves uploading a stream that would be refused at the end and
is the only write-once check on emulators that ignore preconditions on resumable uploads
(fake-gcs-server ≤ 1.54: there two concurrent large uploads of one key can both "win").
After it, the sha256 is added with a metadata patch conditional on the generation written.

Records (``read_record``/``write_record``) are single-request uploads conditional on
``if_generation_match`` (0 to create, else the generation read); the token is the
generation. A record is read as metadata first, then the bytes of that very generation, so
bytes and token always belong together.

Retries of transient faults are the library's (``retry``, default ``DEFAULT_RETRY``: up to
120 s); every failure is translated by ``translate_error``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import requests
from google.api_core.exceptions import GoogleAPICallError, GoogleAPIError, RetryError
from google.api_core.retry import Retry
from google.auth.exceptions import GoogleAuthError
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
from google.cloud.storage.retry import DEFAULT_RETRY

from storage.base import (
    MAX_RECORD_BYTES,
    HashingReader,
    ObjectInfo,
    Record,
    digest_from_hex,
    download_stream,
    read_full,
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

CHUNK_MULTIPLE = 256 * 1024  # resumable upload chunks must be multiples of 256 KiB
_CLIENT_ERRORS = (
    GoogleAPIError,
    InvalidResponse,
    DataCorruption,
    GoogleAuthError,
    requests.RequestException,
)
_TRANSIENT = (RetryError, GoogleAuthError, requests.RequestException)


def translate_error(
    err: Exception, *, endpoint: str, bucket: str, name: str, missing_bucket: bool = False
) -> StorageError:
    """The one mapping from a google-cloud-storage failure to a storage error.

    412 → ``ObjectExists``; 404 → ``ObjectNotFound``, or ``StoreUnavailable`` naming the
    bucket when ``missing_bucket`` says a 404 can only mean that (uploads, listings);
    401/403/408/429/5xx, exhausted retries, auth and connection trouble → ``StoreUnavailable``
    naming the endpoint and bucket; anything else → ``StorageError``.
    """
    where = f"gs://{bucket}/{name} at {endpoint}"
    status = _status(err)
    if status == 412:
        return ObjectExists(f"gs://{bucket}/{name} already exists (objects are written once)")
    if status == 404 and missing_bucket:
        return StoreUnavailable(f"GCS bucket {bucket!r} does not exist at {endpoint}")
    if status == 404:
        return ObjectNotFound(f"gs://{bucket}/{name} does not exist")
    if isinstance(err, _TRANSIENT) or (status and retryable_status(status)):
        return StoreUnavailable(f"{where}: {_summary(err)}")
    return StorageError(f"{where}: {_summary(err)}")


def _status(err: Exception) -> int:
    if isinstance(err, GoogleAPICallError):
        return int(err.code or 0)
    response = getattr(err, "response", None)  # InvalidResponse, DataCorruption
    return int(getattr(response, "status_code", 0) or 0)


def _summary(err: Exception) -> str:
    if isinstance(err, GoogleAPICallError):
        return f"{err.code} {err.message}"
    return f"{type(err).__name__}: {err}"


class GCSStore:
    """Objects under ``gs://<bucket>/<prefix>/`` through ``client``.

    ``retry`` and ``timeout`` go to every call (``retry=None`` disables retries).
    ``options.concurrency`` is unused: resumable uploads send one chunk at a time.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        options: StoreOptions | None = None,
        *,
        retry: Retry | None = DEFAULT_RETRY,
        timeout: float | tuple[float, float] = 60.0,
    ) -> None:
        part_size = (options or StoreOptions()).part_size
        self._client = client
        self._bucket = client.bucket(bucket)
        self._chunk = -(-part_size // CHUNK_MULTIPLE) * CHUNK_MULTIPLE
        self._prefix = prefix.strip("/")
        self._call = {"retry": retry, "timeout": timeout}
        self.url = f"gs://{bucket}/{self._prefix}" if self._prefix else f"gs://{bucket}"

    def put(self, key: str, stream: BinaryIO) -> ObjectInfo:
        name = self._name(key)
        reader = HashingReader(stream)
        first = read_full(reader, self._chunk)
        with self._errors(name, missing_bucket=True):
            if len(first) < self._chunk:
                self._put_single(name, first, reader.digest)
            else:
                self._put_resumable(name, first, reader)
        if len(first) >= self._chunk:
            self._record_digest(name, reader)
        return ObjectInfo(key, reader.size, reader.digest)

    def open(self, key: str) -> BinaryIO:
        """Streams the generation current at the call in ``part_size`` ranged reads."""
        name = self._name(key)
        blob = self._get_blob(name)
        if blob is None:
            raise ObjectNotFound(f"gs://{self._bucket.name}/{name} does not exist")
        with self._errors(name):
            reader = blob.open("rb", chunk_size=self._chunk, **self._call)
        return download_stream(reader, lambda: self._errors(name))

    def stat(self, key: str) -> ObjectInfo | None:
        blob = self._get_blob(self._name(key))
        if blob is None:
            return None
        return ObjectInfo(key, int(blob.size), digest_from_hex((blob.metadata or {}).get("sha256")))

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            with self._errors(name):
                self._bucket.delete_blob(name, **self._call)
        except ObjectNotFound:
            self._check_bucket()

    def list(self, prefix: str = "") -> Iterator[str]:
        return self._list(validate_prefix(prefix))

    def url_for(self, key: str) -> str:
        return f"gs://{self._bucket.name}/{self._name(key)}"

    def read_record(self, key: str) -> Record | None:
        name = self._name(key)
        while True:
            blob = self._get_blob(name)
            if blob is None:
                return None
            if int(blob.size or 0) > MAX_RECORD_BYTES:
                raise record_too_large(self.url_for(key))
            try:
                with self._errors(name):
                    # The blob names its generation: these are the bytes of that state.
                    data = blob.download_as_bytes(if_generation_match=blob.generation, **self._call)
            except (ObjectNotFound, ObjectExists):
                continue  # replaced or deleted between the two requests: read again
            return Record(data, str(blob.generation))

    def write_record(self, key: str, data: bytes, token: str | None) -> str:
        name = self._name(key)
        if len(data) > MAX_RECORD_BYTES:
            raise record_too_large(self.url_for(key))
        if token is not None and not token.isdigit():  # not a generation: matches no state
            raise PreconditionFailed(f"gs://{self._bucket.name}/{name}: {token!r} is no token here")
        blob = self._bucket.blob(name)
        try:
            with self._errors(name, missing_bucket=True):
                blob.upload_from_string(
                    data,
                    content_type="application/octet-stream",
                    if_generation_match=0 if token is None else int(token),
                    **self._call,
                )
        except ObjectExists as err:  # 412, whichever way the precondition failed
            state = "exists" if token is None else "changed since it was read"
            raise PreconditionFailed(f"gs://{self._bucket.name}/{name} {state}") from err
        return str(blob.generation)

    def _name(self, key: str) -> str:
        validate_key(key)
        return f"{self._prefix}/{key}" if self._prefix else key

    def _list(self, prefix: str) -> Iterator[str]:
        base = f"{self._prefix}/" if self._prefix else ""
        with self._errors(base + prefix, missing_bucket=True):
            blobs = self._client.list_blobs(
                self._bucket, prefix=base + prefix, fields="items(name),nextPageToken", **self._call
            )
            # GCS lists in lexical (UTF-8 byte) order, which is Python's str order.
            yield from (blob.name[len(base) :] for blob in blobs)

    def _get_blob(self, name: str) -> Any:
        """The blob with its metadata, or ``None`` if absent (after checking the bucket, since
        a 404 does not tell a missing object from a missing bucket)."""
        with self._errors(name):
            blob = self._bucket.get_blob(name, **self._call)
        if blob is None:
            self._check_bucket()
        return blob

    def _put_single(self, name: str, body: bytes, digest: str) -> None:
        blob = self._bucket.blob(name)
        blob.metadata = {"sha256": digest.removeprefix("sha256:")}
        blob.upload_from_string(
            body, content_type="application/octet-stream", if_generation_match=0, **self._call
        )

    def _put_resumable(self, name: str, first: bytes, reader: HashingReader) -> None:
        if self._bucket.get_blob(name, **self._call) is not None:
            raise ObjectExists(f"gs://{self._bucket.name}/{name} already exists")
        writer = self._bucket.blob(name).open(
            "wb",
            chunk_size=self._chunk,
            content_type="application/octet-stream",
            if_generation_match=0,
            **self._call,
        )
        try:
            chunk = first
            while chunk:
                writer.write(chunk)
                chunk = read_full(reader, self._chunk)
            writer.close()  # sends the last chunk and finalizes: the object appears now
        except BaseException:
            _cancel(writer)
            raise

    def _record_digest(self, name: str, reader: HashingReader) -> None:
        """Add the sha256 to the object just written, so that ``stat`` reports it.

        The object is stored whatever happens here, so failures are logged, not raised;
        ``stat`` then reports no digest. The generation precondition keeps the patch off an
        object that replaced ours in the meantime.
        """
        try:
            with self._errors(name):
                blob = self._bucket.get_blob(name, **self._call)
                if blob is None or blob.size != reader.size:
                    return
                blob.metadata = {"sha256": reader.digest.removeprefix("sha256:")}
                blob.patch(
                    if_generation_match=blob.generation,
                    if_metageneration_match=blob.metageneration,
                    **self._call,
                )
        except StorageError:
            log.warning(
                "could not record the sha256 of gs://%s/%s", self._bucket.name, name, exc_info=True
            )

    def _check_bucket(self) -> None:
        """Raise ``StoreUnavailable`` if the bucket does not exist. Lists one object (objects
        permission) rather than reading the bucket (which object-level roles may not allow)."""
        with self._errors("", missing_bucket=True):
            next(iter(self._client.list_blobs(self._bucket, max_results=1, **self._call)), None)

    @property
    def _endpoint(self) -> str:
        # Only for messages.
        return str(getattr(self._client, "api_endpoint", None) or "storage.googleapis.com")

    @contextmanager
    def _errors(self, name: str, *, missing_bucket: bool = False) -> Iterator[None]:
        try:
            yield
        except _CLIENT_ERRORS as err:
            raise translate_error(
                err,
                endpoint=self._endpoint,
                bucket=self._bucket.name,
                name=name,
                missing_bucket=missing_bucket,
            ) from err


def _cancel(writer: Any) -> None:
    """Cancel a resumable upload session (never finalized, so never visible)."""
    try:
        writer.terminate()
    except Exception:
        # The failure being propagated matters more; an unfinished session expires by itself.
        log.warning("could not cancel a resumable upload", exc_info=True)
