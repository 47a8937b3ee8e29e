"""Prometheus metrics of one service, on a registry of its own (no global state).

Every label has a bounded set of values: the action, an HTTP status, an outcome (succeeded
or a failure kind), a phase name, a catalogue type name (operator configuration; requests
naming an explicit image share ``(image)``), a store backend and operation. Never a run id,
an event source, an image reference or anything a request chooses freely.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Phases range from a millisecond (a store write) to the whole script.
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
# One store call: a small record on a local disk (well under a millisecond) to a large upload.
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
# The age of a resource's last successful check when a check of it arrives, in check
# intervals: about 1 when its checks succeed on schedule; past 3 it is stuck.
CHECK_AGE_BUCKETS = (0.5, 1, 1.5, 2, 3, 5, 10, 30)
EXPLICIT_IMAGE = "(image)"  # the ``type`` label of a request naming an image, not a type


def type_label(type_name: str | None) -> str:
    """The ``type`` label of a request: its catalogue type, or ``(image)``."""
    return type_name or EXPLICIT_IMAGE


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self._count_requests_and_runs()
        self._count_answers_without_runs()
        self._measure_waits_and_the_store()

    def _count_requests_and_runs(self) -> None:
        counter = partial(Counter, registry=self.registry)
        self.requests = counter(
            "resource_function_requests", "Requests by action and HTTP status", ["action", "status"]
        )
        self.runs = counter(
            "resource_function_runs",
            "Resource runs by action and outcome (succeeded or a failure kind)",
            ["action", "outcome"],
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
            "Time resource runs spent per phase (image_pull, stage, create, script, output, "
            "upload, history, store; the kubernetes runtime: launch, pod, result, and inside "
            "the pod, as its collect step reports them: script, collect_start, collect_import, "
            "upload, history, store, reply)",
            ["action", "phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.stops = counter(
            "resource_function_stops",
            "Stop requests taken (a sender stopping one of its requests: the Tekton "
            "controller for a cancelled or timed-out CustomRun)",
            ["action"],
        )
        self.bytes = counter(
            "resource_function_artifact_bytes", "Artifact bytes stored", ["action"]
        )

    def _count_answers_without_runs(self) -> None:
        counter = partial(Counter, registry=self.registry)
        self.cache_hits = counter(
            "resource_function_cache_hits",
            "Requests answered without a run: a get from the artifact cache, a check from "
            "the version history within its interval",
            ["action"],
        )
        self.cache_misses = counter(
            "resource_function_cache_misses",
            "Gets that looked in the artifact cache and did not find their artifact",
            ["action"],
        )
        self.joined = counter(
            "resource_function_joined_runs",
            "Requests that attached to a run already under "
            "way or finished (redelivery, identical concurrent requests)",
            ["action"],
        )

    def _measure_waits_and_the_store(self) -> None:
        gauge = partial(Gauge, registry=self.registry)
        self.store_seconds = Histogram(
            "resource_function_store_seconds",
            "Duration of object store calls (open: until the stream is open; list: until "
            "the listing is read)",
            ["backend", "operation"],
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self.leases_held = gauge(
            "resource_function_check_leases_held",
            "Checks this replica runs now holding their resource's lease",
        )
        self.lease_waiters = gauge(
            "resource_function_check_lease_waiters",
            "Checks waiting now for the run that holds their resource's lease",
        )
        self.tasks_waiting = gauge(
            "resource_function_tasks_waiting",
            "Tasks accepted whose resource script has not started yet (queued, pulling "
            "the image, staging inputs; on Kubernetes: a Job whose pod has not started)",
            ["action"],
        )
        self.check_age = Histogram(
            "resource_function_check_age_intervals",
            "Age of a resource's last successful check when a check of it arrives, in "
            "units of its check interval (checks with an interval and a history only)",
            ["type"],
            buckets=CHECK_AGE_BUCKETS,
            registry=self.registry,
        )

    def count_waiting(self, action: str, waiting: Callable[[], int]) -> None:
        """Report ``waiting()`` (read at each scrape) as ``tasks_waiting{action}``."""
        self.tasks_waiting.labels(action).set_function(lambda: float(waiting()))

    def count_warm(self, counts: Callable[[], WarmFigures], reasons: Sequence[str]) -> None:
        """Report the runtime's warm check containers (read at each scrape); ``reasons``:
        every eviction reason, each reported even at 0."""
        self.registry.register(WarmCollector(counts, reasons))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class WarmFigures(Protocol):
    """The warm check containers' counts a runtime reports (``runtimes.warm.pool.WarmCounts``)."""

    @property
    def alive(self) -> int: ...

    @property
    def sources(self) -> int: ...

    @property
    def reuses(self) -> int: ...

    @property
    def starts(self) -> int: ...

    @property
    def evictions(self) -> Mapping[str, int]: ...


class WarmCollector(Collector):
    """The warm check containers' figures (docs/warm-checks.md), from the runtime's counts."""

    def __init__(self, counts: Callable[[], WarmFigures], reasons: Sequence[str]) -> None:
        self._counts = counts
        self._reasons = tuple(reasons)

    def collect(self) -> Iterator[Metric]:
        now = self._counts()
        yield GaugeMetricFamily(
            "resource_function_warm_containers",
            "Warm check containers (or pods) this replica keeps now",
            value=now.alive,
        )
        yield GaugeMetricFamily(
            "resource_function_warm_sources",
            "Sources whose directory (HOME, TMPDIR) this replica's warm containers keep now",
            value=now.sources,
        )
        yield CounterMetricFamily(
            "resource_function_warm_reuses",
            "Checks run in a warm container that had served a check before",
            value=now.reuses,
        )
        yield CounterMetricFamily(
            "resource_function_warm_starts",
            "Warm check containers started and kept",
            value=now.starts,
        )
        evictions = CounterMetricFamily(
            "resource_function_warm_evictions",
            "Warm check containers removed, by reason (idle, age, replica_cap, team_cap, "
            "dead, drain, quota)",
            labels=["reason"],
        )
        for reason in self._reasons:
            evictions.add_metric([reason], now.evictions.get(reason, 0))
        yield evictions
