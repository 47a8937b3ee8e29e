"""Prometheus metrics of the Tekton controller, on a registry of its own, served at the reply
receiver's ``/metrics``. Labels are bounded: an outcome or a reason from the lists below, or
a condition reason the controller writes (``status.py``). Never a name, namespace or id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
POST_OUTCOMES = ("posted", "refused")
REPLY_OUTCOMES = ("applied", "stale", "dropped", "not_written")
FAILURES = ("conflict", "unavailable", "error")
LIMITS = ("depth", "size", "shape")  # what an undecodable CustomRun was past


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.reconcile_seconds = Histogram(
            "resource_functions_tekton_reconcile_seconds",
            "Time to reconcile one CustomRun (decide, write, post)",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.posts = Counter(
            "resource_functions_tekton_posts",
            "Requests posted to the Broker, by outcome (posted, refused)",
            ["outcome"],
            registry=self.registry,
        )
        self.replies = Counter(
            "resource_functions_tekton_replies",
            "Replies received, by outcome (applied, stale, dropped: not bound to the run, "
            "not_written: the status write failed and Knative delivers it again)",
            ["outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "resource_functions_tekton_reconcile_failures",
            "Reconciles that failed and were retried with backoff (conflict, unavailable, error)",
            ["reason"],
            registry=self.registry,
        )
        self.transitions = Counter(
            "resource_functions_tekton_transitions",
            "CustomRun condition changes written, by reason (Running, Succeeded, a failure kind)",
            ["reason"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "resource_functions_tekton_api_requests",
            "Requests this replica made to the Kubernetes API (watches, lists, reads, writes)",
            registry=self.registry,
        )
        self.undecodable = Counter(
            "resource_functions_tekton_undecodable",
            "CustomRuns of this project skipped because they cannot be decoded within the "
            "controller's bounds, by the limit they were past (depth, size, shape), once per "
            "version of each",
            ["limit"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "resource_functions_tekton_leader",
            "1 while this replica leads (reconciles), else 0",
            registry=self.registry,
        )
        self.resource_posts = Counter(
            "resource_functions_resource_checks_posted",
            "Checks of Resources posted to the Broker, by outcome (posted, refused)",
            ["outcome"],
            registry=self.registry,
        )
        self.resource_replies = Counter(
            "resource_functions_resource_replies",
            "Replies to Resources' checks, by outcome (applied, stale, dropped: not the "
            "check's function or team)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in POST_OUTCOMES:
            self.posts.labels(outcome)
            self.resource_posts.labels(outcome)
        for outcome in ("applied", "stale", "dropped"):
            self.resource_replies.labels(outcome)
        for outcome in REPLY_OUTCOMES:
            self.replies.labels(outcome)
        for reason in FAILURES:
            self.failures.labels(reason)
        for limit in LIMITS:
            self.undecodable.labels(limit)

    def watch(self, queue_depth: Callable[[], int], overdue: Callable[[], int]) -> None:
        """Gauges read when scraped: the work queue's depth, and the running attempts past
        their deadline by more than a minute (the controller should have ended them)."""
        depth = Gauge(
            "resource_functions_tekton_queue_depth",
            "CustomRuns waiting for a worker",
            registry=self.registry,
        )
        depth.set_function(queue_depth)
        late = Gauge(
            "resource_functions_tekton_overdue_runs",
            "Running attempts more than a minute past their deadline (the controller is stuck)",
            registry=self.registry,
        )
        late.set_function(overdue)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
