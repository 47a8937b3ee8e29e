"""The Tekton controller's shell (functions/tekton/controller.py) in-process: a work queue of
CustomRuns, each one's trouble its own; requests posted again until answered; Events and
metrics. The Kubernetes API is testbed/tekton_fake_api.py (kmock serves no custom
resource status here; the cluster tier runs the real one), the Broker a real HTTP sink."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.errors import Unavailable
from functions.model import ResourceType
from functions.tekton import status as st
from functions.tekton.controller import Controller
from functions.tekton.controller_config import ControllerConfig
from functions.tekton.decide import Reply
from functions.tekton.leader import LeaderElection
from functions.tekton.namespace_teams import TEAM_LABEL, NamespaceTeams
from testbed.event_sink import EventSink
from testbed.tekton_fake_api import FakeTektonApi
from tests.support.tekton_pipelines import custom_run

IMAGE = "registry.test/git@sha256:" + "a" * 64


def labels_of(namespace: str) -> dict[str, str] | None:
    if namespace == "poisoned":
        raise Unavailable("the API cannot say")
    return {TEAM_LABEL: namespace}


def customrun(name: str, namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    params = {"type": "git", "source": json.dumps({"uri": name}), "version": '{"ref": "1"}'}
    return custom_run(name, namespace, params, **spec)


class Running:
    """A controller reconciling in a thread until the test ends."""

    def __init__(self, sink: EventSink, **options: Any) -> None:
        self.api = FakeTektonApi()
        config = ControllerConfig(
            broker=sink.url,
            store_url="s3://bucket/ci",
            resource_types={"git": ResourceType(image=IMAGE)},
            resync_seconds=60,
        )
        self.controller = Controller(
            self.api,  # type: ignore[arg-type]
            config,
            NamespaceTeams(None, labels_of),
            **options,
        )
        self.thread = threading.Thread(target=self.controller.run, daemon=True)

    def condition(self, namespace: str, name: str) -> dict[str, Any]:
        return st.condition_of(self.api.status_of(namespace, name)) or {}

    def wait(self, what: str, check: Any, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
            time.sleep(0.05)

    def ordinary_ones_run(self, what: str, count: int = 3) -> None:
        """``fine-N`` in namespace ``team-N`` for each N below ``count``, each then Running."""
        for n in range(count):
            self.api.create(customrun(f"fine-{n}", f"team-{n}"))
        self.wait(
            what,
            lambda: all(
                self.condition(f"team-{n}", f"fine-{n}").get("reason") == st.RUNNING
                for n in range(count)
            ),
        )


@pytest.fixture
def running(sink: EventSink) -> Iterator[Running]:
    made = Running(sink, repost_first=0.5)
    made.thread.start()
    yield made
    made.controller.stopped.set()
    made.thread.join(10)


def request_ids(sink: EventSink, subject_name: str) -> list[str]:
    return [
        e.get_id()
        for e in sink.events
        if e.get_attributes().get("subject", "").endswith(subject_name)
    ]


def test_a_customrun_whose_team_cannot_be_read_holds_no_other(
    running: Running, sink: EventSink
) -> None:
    """Its reconcile fails (the API cannot say its namespace's team): logged, counted, retried
    with backoff; the others of every namespace are posted and Running meanwhile."""
    running.api.create(customrun("stuck", "poisoned"))
    running.api.fail_writes_of["broken"] = RuntimeError("a bug writing this one")
    running.api.create(customrun("broken", "team-a"))
    running.ordinary_ones_run("the healthy ones Running")
    running.wait("their requests posted", lambda: len({e.get_id() for e in sink.events}) == 3)
    assert running.api.status_of("poisoned", "stuck") == {}
    metrics = running.controller.metrics

    def counted() -> bool:
        text = metrics.exposition().decode()
        return all(
            f'resource_functions_tekton_reconcile_failures_total{{reason="{reason}"}} 0.0'
            not in text
            for reason in ("error", "unavailable")
        )

    running.wait("both failures counted", counted)
    assert running.thread.is_alive()


def test_a_lost_reply_is_made_good_by_posting_the_request_again(
    running: Running, sink: EventSink
) -> None:
    """The functions attach a re-post to the run under way, or answer it from the stored
    result: posting again until the run ends completes it whatever reply was lost."""
    running.api.create(customrun("lost"))
    running.wait("posted twice", lambda: len(request_ids(sink, "/lost")) >= 2, timeout=5)
    ids = request_ids(sink, "/lost")
    assert len(set(ids)) == 1, "the same request, so the same run"
    status = running.api.status_of("team-a", "lost")
    request = status["extraFields"]["requestId"]
    data = {"version": {"ref": "1"}, "metadata": [], "artifact": {"url": "u", "digest": "d"}}
    reply = Reply(request, True, data, "get", "/resource-functions/get", "team-a")
    running.controller.reply("team-a", "lost", reply)
    assert running.condition("team-a", "lost")["status"] == "True"
    posted = len(request_ids(sink, "/lost"))
    time.sleep(1.5)
    assert len(request_ids(sink, "/lost")) == posted, "no post for a finished run"


def test_a_cancelled_run_posts_the_stop_of_its_request_and_ends_cancelled(
    running: Running, sink: EventSink
) -> None:
    """The controller knows no Job: it asks the functions to stop the attempt's request (the
    request's type, source and team, ``stops`` naming its id) and the run ends cancelled."""
    running.api.create(customrun("doomed"))
    running.wait("posted", lambda: bool(request_ids(sink, "/doomed")))
    request = running.api.status_of("team-a", "doomed")["extraFields"]["requestId"]
    running.api.cancel("team-a", "doomed")
    running.wait(
        "cancelled", lambda: running.condition("team-a", "doomed").get("reason") == st.CANCELLED
    )
    running.wait(
        "the stop posted",
        lambda: any(e.get_extension("stops") == request for e in sink.events),
    )
    (stop,) = [e for e in sink.events if e.get_extension("stops") == request]
    (posted, *_) = [e for e in sink.events if e.get_id() == request]
    assert stop.get_type() == posted.get_type() == "dev.resourcefunctions.get.requested"
    assert (stop.get_source(), stop.get_extension("team")) == (
        posted.get_source(),
        posted.get_extension("team"),
    )
    assert stop.get_id() == f"stop-{request}"


def test_a_slow_post_of_one_team_holds_no_other_team(sink: EventSink) -> None:
    sink.hold = lambda event: 4.0 if event.get_attributes().get("team") == "team-slow" else 0.0
    running = Running(sink, repost_first=60)
    running.thread.start()
    try:
        running.api.create(customrun("slow", "team-slow"))
        time.sleep(0.3)
        started = time.monotonic()
        running.api.create(customrun("quick", "team-quick"))
        running.wait("the quick one posted", lambda: request_ids(sink, "/quick"), timeout=3)
        assert time.monotonic() - started < 2
    finally:
        running.controller.stopped.set()
        running.thread.join(10)


def test_a_cancel_is_taken_while_its_runs_request_is_still_being_posted(sink: EventSink) -> None:
    """The in-memory channel holds a post until it has delivered the event, through all its
    retries: meanwhile the run's key is free, so a cancel ends the run at once and its stop
    is posted beside the request's post, not after it."""
    sink.hold = lambda event: 0.0 if event.get_extension("stops") else 6.0
    running = Running(sink, repost_first=60)
    running.thread.start()
    try:
        running.api.create(customrun("held"))
        running.wait("the post under way", lambda: request_ids(sink, "/held"), timeout=3)
        started = time.monotonic()
        running.api.cancel("team-a", "held")
        running.wait(
            "cancelled", lambda: running.condition("team-a", "held").get("reason") == st.CANCELLED
        )
        running.wait("the stop posted", lambda: any(e.get_extension("stops") for e in sink.events))
        assert time.monotonic() - started < 3
    finally:
        running.controller.stopped.set()
        running.thread.join(10)


def test_each_transition_is_an_event_on_the_customrun_and_a_dropped_reply_a_warning(
    running: Running, sink: EventSink
) -> None:
    running.api.create(customrun("seen"))
    running.wait("Running", lambda: running.condition("team-a", "seen").get("status"))
    request = running.api.status_of("team-a", "seen")["extraFields"]["requestId"]
    forged = Reply(request, True, {}, "get", "/resource-functions/get", "team-b")
    running.controller.reply("team-a", "seen", forged)
    error = {"kind": "resource_failed", "message": "no such ref"}
    failed = Reply(request, False, {"error": error}, "get", "/resource-functions/get", "team-a")
    running.controller.reply("team-a", "seen", failed)
    events = [
        (warning, reason) for name, warning, reason, _ in running.api.events if name == "seen"
    ]
    assert events == [(False, "Running"), (True, "ReplyDropped"), (True, "ResourceFailed")]
    metrics = running.controller.metrics.exposition().decode()
    assert 'resource_functions_tekton_replies_total{outcome="dropped"} 1.0' in metrics
    assert 'resource_functions_tekton_transitions_total{reason="ResourceFailed"} 1.0' in metrics


def test_an_attempt_past_its_deadline_is_counted_overdue_until_it_ends(sink: EventSink) -> None:
    running = Running(sink)
    stale = customrun("stale", timeout="1s")
    stale["status"] = st.started({}, "r" * 32, "team-a", st.parse_time("2026-01-01T00:00:00Z"))
    running.api.create(stale)
    running.controller._remember(running.api.read_customrun("team-a", "stale") or {})
    assert running.controller.overdue() == 1
    running.controller.reconcile(("team-a", "stale"))
    assert running.condition("team-a", "stale")["reason"] == st.TIMED_OUT
    assert running.controller.overdue() == 0


def test_one_of_two_replicas_leads_and_the_other_takes_over_once_it_stops_renewing() -> None:
    api = FakeTektonApi()
    now = [st.parse_time("2026-12-04T00:00:00Z")]
    one, two = (
        LeaderElection(api, "ns", "lease", who, lease_seconds=15, clock=lambda: now[0])  # type: ignore[arg-type]
        for who in ("one", "two")
    )
    assert one.try_lead() and not two.try_lead()
    assert one.try_lead(), "the leader renews"
    from datetime import timedelta

    now[0] += timedelta(seconds=10)
    assert not two.try_lead(), "renewed 10 s ago: still the leader's"
    now[0] += timedelta(seconds=6)
    assert two.try_lead(), "15 s without renewal: free"
    assert not one.try_lead(), "the old leader finds it taken"
    assert api.leases[("ns", "lease")]["spec"]["leaseTransitions"] == 1


def test_the_tekton_dashboard_and_alert_ask_only_for_metrics_the_controller_exposes() -> None:
    import re
    from pathlib import Path

    from functions.tekton.controller_metrics import ControllerMetrics

    metrics = ControllerMetrics()
    metrics.watch(lambda: 0, lambda: 0)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exposed = {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes[family.type]
    }
    monitoring = Path(__file__).resolve().parents[2] / "knative" / "monitoring"
    panels = json.loads((monitoring / "tekton-dashboard.json").read_text())["panels"]
    asked = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"resource_functions_tekton_\w+", target["expr"])
    }
    asked |= set(
        re.findall(r"resource_functions_tekton_\w+", (monitoring / "rules.yaml").read_text())
    )
    assert asked and asked <= exposed, asked - exposed


def test_a_post_the_broker_refuses_for_good_ends_the_run_saying_why(
    running: Running, sink: EventSink
) -> None:
    """403: no EventPolicy lets the controller post for this team. Posting again every few
    seconds until the timeout would help no one."""
    sink.status = 403
    running.api.create(customrun("unlisted", "team-x"))
    running.wait("ended", lambda: running.condition("team-x", "unlisted").get("status") == "False")
    found = running.condition("team-x", "unlisted")
    assert found["reason"] == st.REFUSED
    assert "403" in found["message"] and "'team-x'" in found["message"]


def test_a_broker_that_is_away_is_posted_to_again(running: Running, sink: EventSink) -> None:
    sink.status = 503
    running.api.create(customrun("later"))
    running.wait("refused once", lambda: len(sink.attempts) >= 3)
    assert running.condition("team-a", "later")["status"] == "Unknown"
    sink.status = 202
    running.wait("posted", lambda: request_ids(sink, "/later"), timeout=15)
