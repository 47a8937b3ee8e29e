"""A test server as its clients see it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Server:
    """An endpoint and the environment (``None`` = unset) that points client libraries at it."""

    endpoint: str
    env: Mapping[str, str | None] = field(default_factory=dict)
