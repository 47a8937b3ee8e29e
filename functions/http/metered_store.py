"""A store that times every call into ``resource_function_store_seconds{backend,operation}``.

It wraps the service's store (and so the container runtime's, which shares it) without
changing what any call does or raises. ``open`` is timed until the stream is open (the
caller reads it at its own pace); ``list`` until the caller has read the listing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from prometheus_client import Histogram

from storage import Store
from storage.base import ObjectInfo, Record

BACKENDS = {"s3": "s3", "gs": "gcs", "file": "file"}


def backend_of(url: str) -> str:
    """The ``backend`` label of a store URL: ``s3``, ``gcs`` or ``file``."""
    return BACKENDS.get(url.partition("://")[0], "other")


class MeteredStore:
    def __init__(self, store: Store, seconds: Histogram) -> None:
        self.inner = store  # the store it times
        self._store = store
        self._seconds = seconds
        self._backend = backend_of(store.url)
        self.url = store.url

    @contextmanager
    def _timed(self, operation: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self._seconds.labels(self._backend, operation).observe(time.monotonic() - started)

    def put(self, key: str, stream: BinaryIO) -> ObjectInfo:
        with self._timed("put"):
            return self._store.put(key, stream)

    def open(self, key: str) -> BinaryIO:
        with self._timed("open"):
            return self._store.open(key)

    def stat(self, key: str) -> ObjectInfo | None:
        with self._timed("stat"):
            return self._store.stat(key)

    def delete(self, key: str) -> None:
        with self._timed("delete"):
            self._store.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        with self._timed("list"):
            yield from self._store.list(prefix)

    def url_for(self, key: str) -> str:
        return self._store.url_for(key)

    def read_record(self, key: str) -> Record | None:
        with self._timed("read_record"):
            return self._store.read_record(key)

    def write_record(self, key: str, data: bytes, token: str | None) -> str:
        with self._timed("write_record"):
            return self._store.write_record(key, data, token)
