"""``/readyz`` against the real stores: each backend that answers is ready; a store whose
bucket is missing is not (the container engine: ``tests/e2e/test_readiness_on_podman.py``)."""

from __future__ import annotations

from typing import Any

from functions.http.readiness import Readiness
from storage import Store, open_store
from storage.tuning import StoreOptions
from tests.support.http_helpers import FakeRuntime


def test_every_store_backend_that_answers_is_ready(store: Store) -> None:
    assert Readiness(store, FakeRuntime(store)).probe() == (200, {"status": "ready"})


def test_a_store_whose_bucket_is_missing_is_not_ready(s3_env: Any) -> None:
    store = open_store("s3://rf-no-such-bucket/p", StoreOptions.from_process_env())
    status, body = Readiness(store, FakeRuntime(store)).probe()
    assert status == 503
    assert "rf-no-such-bucket" in body["store"]
    assert "runtime" not in body
