"""The part of ``Settings`` that a ``Service`` reads: what it validates requests against,
names runs and cache entries with, and how long it lets a run take."""

from __future__ import annotations

from dataclasses import dataclass, field

from functions.model import ResourceType
from functions.settings import Settings


@dataclass(frozen=True)
class ServiceConfig:
    cache_secret: bytes = field(repr=False)
    resource_types: dict[str, ResourceType]
    allowed_images: tuple[str, ...]
    sender_teams: tuple[tuple[str, tuple[str, ...]], ...]
    senders_known: bool  # SENDER_AUDIENCE set: a request's sender is authenticated
    reply_mode: str
    sink: str
    task_timeout_seconds: float
    task_margin_seconds: float
    check_lease_seconds: float
    history_limit: int
    redact_keys: tuple[str, ...]
    cache_recheck_seconds: float
    tracing: bool
    max_runs_per_team: int

    @classmethod
    def of(cls, settings: Settings) -> ServiceConfig:
        return cls(
            cache_secret=settings.cache_secret,
            resource_types=settings.resource_types,
            allowed_images=settings.allowed_images,
            sender_teams=settings.sender_teams,
            senders_known=bool(settings.sender_audience),
            reply_mode=settings.reply_mode,
            sink=settings.sink,
            task_timeout_seconds=settings.task_timeout_seconds,
            task_margin_seconds=settings.task_margin_seconds,
            check_lease_seconds=settings.check_lease_seconds,
            history_limit=settings.history_limit,
            redact_keys=settings.redact_keys,
            cache_recheck_seconds=settings.cache_recheck_seconds,
            tracing=settings.tracing,
            max_runs_per_team=settings.max_runs_per_team,
        )
