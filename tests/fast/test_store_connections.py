"""A service's S3 client keeps a connection for every request thread and part in flight:
with fewer, 16 request threads on the store at once made urllib3 close connections ("Connection
pool is full") and open new ones. Opening the client makes no network call."""

from __future__ import annotations

from typing import Any

import pytest

from functions.http.app import create_app
from functions.settings import Settings
from storage import StoreOptions
from tests.support.http_helpers import FakeRuntime


def s3_pool_size(store: Any) -> int:
    return int(store.inner._client.meta.config.max_pool_connections)  # under MeteredStore


@pytest.mark.parametrize(
    ("threads", "concurrency", "pool"),
    [(16, 4, 64), (32, 1, 32), (1, 4, 10)],
    ids=["16-threads-4-parts", "32-threads-1-part", "1-thread-the-floor"],
)
def test_a_services_s3_pool_holds_a_connection_per_thread_and_part(
    threads: int, concurrency: int, pool: int
) -> None:
    settings = Settings(
        store_url="s3://bucket/prefix",
        threads=threads,
        store_options=StoreOptions(concurrency=concurrency),
    )
    app = create_app(settings, "get", runtime=FakeRuntime(None))  # type: ignore[arg-type]
    assert s3_pool_size(app.extensions["service"].store) == pool
