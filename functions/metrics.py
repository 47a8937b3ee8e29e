"""Prometheus metrics of one service, on a registry of its own (no global state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Phases range from a millisecond (a store write) to the whole script.
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "resource_function_requests",
            "Requests by action and HTTP status",
            ["action", "status"],
            registry=self.registry,
        )
        self.runs = Counter(
            "resource_function_runs",
            "Resource runs by action and outcome (succeeded or a failure kind)",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "resource_function_run_duration_seconds",
            "Duration of resource runs",
            ["action"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.phase_duration = Histogram(
            "resource_function_run_phase_seconds",
            "Time resource runs spent per phase (image_pull, stage, script, output, upload, "
            "store, cleanup; the kubernetes runtime: launch, pod, result)",
            ["action", "phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "resource_function_cache_hits",
            "Gets answered from the artifact cache",
            ["action"],
            registry=self.registry,
        )
        self.joined = Counter(
            "resource_function_joined_runs",
            "Requests that attached to a run already under "
            "way or finished (redelivery, identical concurrent requests)",
            ["action"],
            registry=self.registry,
        )
        self.bytes = Counter(
            "resource_function_artifact_bytes",
            "Artifact bytes stored",
            ["action"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
