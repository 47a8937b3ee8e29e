"""Fixtures of the fast tier: no server, no container, no cluster. A store in a temp
directory, the fake runtime on it, and the test client of a service over both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storage import Store, open_store
from tests.support.http_helpers import FakeRuntime, make_client


@pytest.fixture
def store(tmp_path: Path) -> Store:
    (tmp_path / "store").mkdir()
    return open_store((tmp_path / "store").as_uri())


@pytest.fixture
def fake_runtime(store: Store) -> FakeRuntime:
    return FakeRuntime(store)


@pytest.fixture
def client(store: Store, fake_runtime: FakeRuntime) -> Callable[..., Any]:
    """``client(action, **settings)``: the test client of that service on ``store`` and
    ``fake_runtime``."""
    return lambda action, **settings: make_client(store, action, fake_runtime, **settings)
