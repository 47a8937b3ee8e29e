"""A burst of checks (issue 49): every resource of a CI due in the same second, as a thousand
PingSources on one schedule post them, sent at once through the Broker to the shipped check
Service (warm checks on), the resources spread over four teams.

Asserted: every check answered once and succeeded, and every check script ran once (its
repository read once: ``counter.py``), whether it ran warm or, finding no warm pod with room
within ``WARM_CHECK_WAIT_SECONDS``, as a Job. Printed: from the first post to the last reply,
each reply's lag from the burst's start (p50, p99), the Jobs the functions created (the API
server's audit log; issue 49's goal is none), the check replicas and warm pods it took, and
the posts the Broker refused on the way (retried by the sender).

Benchmark (``bench``): ``RF_BURST_CHECKS`` checks, 1,000 with ``RF_BENCH=full``, 120 in CI.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster.test_knative_path import (
    WARM_POD,
    assert_reply,
    attributes,
    post,
    reply_to,
    source,
)
from tests.cluster.timeline import audit_entries, percentile
from tests.support.bench import size
from tests.support.events import request_event

CHECKS = size("RF_BURST_CHECKS", 1000, 120)
TEAMS = ("main", "blue", "green", "red")
SENDERS = 32  # posts in flight at once: the burst leaves the test in a second or two


def posted_until_accepted(url: str, event) -> tuple[float, list[int]]:
    """POST ``event`` until the Broker takes it (202): when it was taken, and each status
    that refused it before (a sender retries those, as a PingSource does)."""
    refused: list[int] = []
    while True:
        status, _ = post(url, event)
        if status == 202:
            return time.monotonic(), refused
        refused.append(status)
        assert len(refused) < 10, f"the Broker refused {attributes(event)['id']}: {refused}"
        time.sleep(0.5)


@pytest.mark.bench
@pytest.mark.timeout(1800)
def test_a_burst_of_checks_is_answered_once_each(knative_deployment, counted, capsys):
    d = knative_deployment
    urls = [counted.url_for(uuid.uuid4().hex) for _ in range(CHECKS)]
    checks = [
        request_event(
            "check",
            {
                "type": "test",
                "source": source(count_url=url),
                "build": {"team": TEAMS[i % len(TEAMS)], "pipeline": "burst", "id": str(i)},
            },
        )
        for i, url in enumerate(urls)
    ]
    offset = d.cluster.audit_log.stat().st_size
    started = time.monotonic()
    with ThreadPoolExecutor(SENDERS) as pool:
        accepted = list(pool.map(lambda e: posted_until_accepted(d.broker, e), checks))
    sent = time.monotonic() - started

    lags = []
    for check in checks:
        reply = reply_to(d, check, "check", timeout=600)
        assert assert_reply(reply, check, "check")["versions"][-1] == {"ref": "3"}
        lags.append(d.sink.arrival(reply) - started)
    time.sleep(5)  # a second reply to any of them would come within the Broker's retries
    for check in checks:
        replies = {
            attributes(e)["id"]
            for e in d.sink.matching(requestid=attributes(check)["id"])
            if not attributes(e)["type"].endswith(".discovered")
        }
        assert len(replies) == 1, (attributes(check)["id"], replies)
    assert [counted.reads(url) for url in urls] == [1] * CHECKS

    entries = audit_entries(d.cluster.audit_log, offset)
    jobs = [
        e
        for e in entries
        if e.get("verb") == "create" and (e.get("objectRef") or {}).get("resource") == "jobs"
    ]
    warm_pods = json.loads(
        d.cluster.kubectl("-n", d.tasks_namespace, "get", "pods", "-l", WARM_POD, "-o", "json")
    )["items"]
    replicas = d.cluster.kubectl(
        "-n", d.namespace, "get", "pods", "-l", "serving.knative.dev/service=check", "-o", "name"
    ).split()
    refused = [status for _, statuses in accepted for status in statuses]
    with capsys.disabled():
        print(
            f"\n[burst] {CHECKS} checks of {len(TEAMS)} teams posted at once ({SENDERS} "
            f"senders, {sent:.1f} s to post): all answered once, each script run once; "
            f"last reply {max(lags):.1f} s after the start, p50 {percentile(lags, 0.5):.1f} s, "
            f"p99 {percentile(lags, 0.99):.1f} s; Jobs {len(jobs)}; {len(replicas)} check replicas, "
            f"{len(warm_pods)} warm pods; posts the Broker refused: {len(refused)} "
            f"({sorted(set(refused))})"
        )
