"""Object stores behind one interface; ``open_store`` turns a store URL into a backend.

    s3://BUCKET[/PREFIX]    S3, MinIO: boto3's usual configuration (AWS_ENDPOINT_URL_S3,
                            AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, profiles, …)
    gs://BUCKET[/PREFIX]    GCS: application default credentials, or STORAGE_EMULATOR_HOST
    file:///ABS/PATH        a directory that exists

This module is the only place that knows the URL schemes; ``storage.clients`` builds the
client libraries' clients (the one storage module that looks at their environment
variables), and the backends receive theirs. Cloud libraries are imported only when their scheme is
used, so the file backend works (and imports fast) without them.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from storage.base import ObjectInfo, Store, get_json, key_problem, put_json
from storage.store_errors import (
    InvalidKey,
    InvalidStoreURL,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StoreUnavailable,
)
from storage.tuning import StoreOptions

__all__ = [
    "InvalidKey",
    "InvalidStoreURL",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "StorageError",
    "Store",
    "StoreOptions",
    "StoreUnavailable",
    "get_json",
    "open_store",
    "put_json",
]

SCHEMES = ("s3", "gs", "file")
_BUCKET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def open_store(url: str, options: StoreOptions | None = None) -> Store:
    """The store for ``url`` (``s3://bucket/prefix``, ``gs://bucket/prefix``, ``file:///path``).

    ``options`` defaults to ``StoreOptions.from_process_env()`` (the services pass the
    options their settings read once). Makes no network call:
    an unreachable endpoint or missing bucket surfaces as ``StoreUnavailable`` on first use.
    Raises ``InvalidStoreURL`` saying what is wrong with the URL (never echoing credentials),
    or ``StoreUnavailable`` if GCS credentials cannot be found.
    """
    parts = _split(url)
    if options is None:
        options = StoreOptions.from_process_env()
    if parts.scheme == "file":
        return _file_store(url, parts)
    bucket, prefix = _bucket_and_prefix(url, parts)
    if parts.scheme == "s3":
        from storage.clients import s3_store

        return s3_store(bucket, prefix, options)
    from storage.clients import gcs_store

    return gcs_store(bucket, prefix, options)


def _split(url: str) -> SplitResult:
    if not isinstance(url, str) or not url.strip():
        raise InvalidStoreURL("the store URL is empty: use s3://BUCKET/PREFIX, gs://… or file:///…")
    parts = urlsplit(url.strip())
    if "@" in parts.netloc:
        raise InvalidStoreURL(
            f"the {parts.scheme}:// store URL holds user info; credentials never go in the URL "
            "(use the AWS_* variables or GOOGLE_APPLICATION_CREDENTIALS)"
        )
    if not parts.scheme:
        raise InvalidStoreURL(f"store URL {url!r} has no scheme: use s3://, gs:// or file://")
    if parts.scheme not in SCHEMES:
        raise InvalidStoreURL(
            f"store URL {url!r} has the unknown scheme {parts.scheme!r}: use s3://, gs:// or file://"
        )
    if parts.query or parts.fragment:
        shown = parts._replace(query="", fragment="").geturl()  # a query may hold secrets
        raise InvalidStoreURL(
            f"store URL {shown!r}…: query strings and fragments are not supported"
        )
    return parts


def _bucket_and_prefix(url: str, parts: SplitResult) -> tuple[str, str]:
    bucket = parts.netloc
    if not bucket:
        raise InvalidStoreURL(
            f"store URL {url!r} names no bucket: use {parts.scheme}://BUCKET[/PREFIX]"
        )
    if not set(bucket) <= _BUCKET_CHARS:
        raise InvalidStoreURL(
            f"store URL {url!r}: bucket {bucket!r} may hold only letters, digits, '.', '-' and "
            "'_' (an endpoint or port belongs in AWS_ENDPOINT_URL_S3 / STORAGE_EMULATOR_HOST)"
        )
    prefix = parts.path.strip("/")
    problem = key_problem(prefix) if prefix else None
    if problem:
        raise InvalidStoreURL(f"store URL {url!r}: prefix {prefix!r}: {problem}")
    return bucket, prefix


def _file_store(url: str, parts: SplitResult) -> Store:
    from storage.file import FileStore

    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost"):
        raise InvalidStoreURL(
            f"store URL {url!r}: a file URL takes an absolute path after three slashes, "
            f"file:///abs/path ({parts.netloc!r} was read as a host name)"
        )
    if not path.startswith("/"):
        raise InvalidStoreURL(f"store URL {url!r}: the path must be absolute (file:///abs/path)")
    if ".." in path.split("/"):
        raise InvalidStoreURL(f"store URL {url!r}: the path must not contain '..'")
    return FileStore(Path(path))
