"""Resources as Kubernetes objects on the real cluster (issue 51, docs/resources.md), on the
``secured`` deployment, whose Tekton component carries the CRD and the controller that
schedules them: a Resource is checked on its interval through the Broker and the shipped check
Service, and a commit shows in its status within one interval, in ``kubectl get resources``
too; a source's literal credential shows nowhere a user or operator reads; a namespace
without a team is refused in the status; pausing and deleting stop its checks (its
repository, ``counter.py``, is read no more); the leading controller killed neither skips a
slot nor posts a second check in one; many Resources are posted spread over their interval
(the Broker's sink sees every request).

Sizes (``bench``): ``RF_RESOURCES`` Resources checked every ``RF_RESOURCES_EVERY`` seconds
for the spread (1,000 every 60 s with ``RF_BENCH=full``; 40 every 10 s in CI).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter as Tally
from collections.abc import Iterator

import pytest

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply
from tests.cluster.conftest import NAMESPACE
from tests.cluster.counter import Counter
from tests.cluster.custom_task import CONTROLLER, CustomTask, custom_task_in
from tests.cluster.secured import PIPELINE_TEAMS, Secured
from tests.support.bench import size

TEAM_NAMESPACE = PIPELINE_TEAMS[0]  # labelled as its team; the controller may post for it
STRAY = "resources-without-team"
CANARY = "resources-canary-5e1b"  # a literal credential in a source: never shown
SPREAD = size("RF_RESOURCES", 1000, 40)
SPREAD_EVERY = size("RF_RESOURCES_EVERY", 60, 10)


@pytest.fixture(scope="module")
def users(cluster: Cluster, secured: Secured, tekton) -> Iterator[CustomTask]:
    with custom_task_in(cluster, secured, TEAM_NAMESPACE) as installed:
        cluster.kubectl("create", "namespace", STRAY, check=False)
        yield installed
        cluster.kubectl("-n", TEAM_NAMESPACE, "delete", "resources", "--all", "--wait=false")
        cluster.kubectl("-n", STRAY, "delete", "resources", "--all", "--wait=false")


def resource(name: str, namespace: str, source: dict, every: str = "10s") -> dict:
    return {
        "apiVersion": "resource-functions.dev/v1alpha1",
        "kind": "Resource",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "test", "source": source, "checkEvery": every},
    }


def status_of(cluster: Cluster, namespace: str, name: str) -> dict:
    out = cluster.kubectl("-n", namespace, "get", "resource", name, "-o", "json")
    return json.loads(out).get("status") or {}


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(1)
    return found


def data_of(event) -> dict:
    data = event.get_data()
    return data if isinstance(data, dict) else json.loads(data)


def checked(status: dict) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Checked"), {})


def test_a_resource_is_checked_on_its_interval_and_a_commit_shows_in_its_status(
    users: CustomTask, counted: Counter
) -> None:
    cluster, d = users.cluster, users.deployment
    url = counted.url_for(uuid.uuid4().hex)
    source = {"count_url": url, "password": CANARY}
    apply(cluster, [resource("app", TEAM_NAMESPACE, source)])
    first = wait_for(
        "the first check's version", lambda: status_of(cluster, TEAM_NAMESPACE, "app").get("latest")
    )
    assert first == "ref=3" and counted.reads(url) >= 1
    counted.value = 4  # a commit: versions 1..4 from now on
    committed = time.monotonic()
    wait_for(
        "the commit in the status",
        lambda: status_of(cluster, TEAM_NAMESPACE, "app").get("latest") == "ref=4",
        timeout=10 + 30,  # one interval, and the post's and the check's own time
    )
    within = time.monotonic() - committed
    status = status_of(cluster, TEAM_NAMESPACE, "app")
    assert status["versionsSeen"] == 4 and checked(status)["reason"] == "Succeeded"
    listed = cluster.kubectl("-n", TEAM_NAMESPACE, "get", "resources")
    header, row = listed.splitlines()[0].split(), listed.splitlines()[1].split()
    assert header[:5] == ["NAME", "TYPE", "LATEST", "CHECKED", "STATE"]
    assert row[:3] == ["app", "test", "ref=4"] and row[4] == "Succeeded"
    # The new version went out as the functions' version.discovered event, by its subject.
    subject = f"resource-functions.dev/resources/{TEAM_NAMESPACE}/app"
    found = d.sink.matching(subject=subject, type="dev.resourcefunctions.version.discovered")
    assert {"ref": "4"} in [data_of(e)["version"] for e in found], found
    # The literal credential reached the script (the functions hand the source over) and
    # nothing a user or operator reads.
    readable = {
        "Resource": cluster.kubectl("-n", TEAM_NAMESPACE, "get", "resource", "app", "-o", "json"),
        "Events": cluster.kubectl("-n", TEAM_NAMESPACE, "get", "events", "-o", "json"),
        "controller logs": users.controller_logs(tail=-1),
        "events at the sink": "\n".join(
            json.dumps(e.get_data()) for e in d.sink.events if "discovered" in e.get_type()
        ),
    }
    readable["Resource"] = json.dumps(json.loads(readable["Resource"])["status"])
    for where, text in readable.items():
        assert CANARY not in text, where
    print(f"\n[resources] a commit showed in the status {within:.1f} s after it (interval 10 s)")


def test_a_resource_in_a_namespace_without_a_team_is_refused_in_its_status(
    users: CustomTask, counted: Counter
) -> None:
    cluster = users.cluster
    url = counted.url_for(uuid.uuid4().hex)
    apply(cluster, [resource("stray", STRAY, {"count_url": url})])
    condition = wait_for(
        "its Checked condition", lambda: checked(status_of(cluster, STRAY, "stray"))
    )
    assert (condition["status"], condition["reason"]) == ("False", "NoTeam")
    assert STRAY in condition["message"]
    time.sleep(12)  # an interval: nothing posted for it
    assert counted.reads(url) == 0


def test_pausing_and_deleting_stop_a_resources_checks(users: CustomTask, counted: Counter) -> None:
    cluster = users.cluster
    urls = {name: counted.url_for(uuid.uuid4().hex) for name in ("paused", "deleted")}
    apply(cluster, [resource(n, TEAM_NAMESPACE, {"count_url": u}) for n, u in urls.items()])
    latest = {
        name: wait_for(
            f"{name} checked", lambda n=name: status_of(cluster, TEAM_NAMESPACE, n).get("latest")
        )
        for name in urls
    }
    patch = json.dumps({"spec": {"paused": True}})
    cluster.kubectl(
        "-n", TEAM_NAMESPACE, "patch", "resource", "paused", "--type=merge", "-p", patch
    )
    cluster.kubectl("-n", TEAM_NAMESPACE, "delete", "resource", "deleted")
    time.sleep(3)  # a check already posted may still read
    reads = {name: counted.reads(url) for name, url in urls.items()}
    time.sleep(25)  # two intervals and more
    assert {name: counted.reads(url) for name, url in urls.items()} == reads
    assert status_of(cluster, TEAM_NAMESPACE, "paused")["latest"] == latest["paused"]  # kept


def test_a_leader_change_neither_skips_a_slot_nor_posts_a_second_check_in_one(
    users: CustomTask, counted: Counter
) -> None:
    """The leading controller replica killed (no grace) while a Resource is checked every
    30 s: the other takes the Lease over (15 s) and goes on. Every slot from the first check
    to the last one begun has one request id at the Broker's sink (a claim posted again by the
    new leader is the same id), and the script ran once for each."""
    from functions.resources import schedule

    cluster, d = users.cluster, users.deployment
    url = counted.url_for(uuid.uuid4().hex)
    apply(cluster, [resource("steady", TEAM_NAMESPACE, {"count_url": url}, every="30s")])
    wait_for("a first check", lambda: counted.reads(url) >= 1, timeout=90)
    lease = json.loads(
        cluster.kubectl("-n", NAMESPACE, "get", "lease", "tekton-controller", "-o", "json")
    )
    killed = lease["spec"]["holderIdentity"]
    cluster.kubectl("-n", NAMESPACE, "delete", "pod", killed, "--force", "--grace-period=0")
    time.sleep(80)  # the Lease runs out, and two slots more
    uid = json.loads(
        cluster.kubectl("-n", TEAM_NAMESPACE, "get", "resource", "steady", "-o", "json")
    )["metadata"]["uid"]
    cluster.kubectl("-n", TEAM_NAMESPACE, "delete", "resource", "steady")
    time.sleep(5)  # a check posted just before has read by now
    subject = f"resource-functions.dev/resources/{TEAM_NAMESPACE}/steady"
    ids = {
        e.get_id()
        for e in d.sink.matching(subject=subject, type="dev.resourcefunctions.check.requested")
    }
    now, offset = time.time(), schedule.offset_of(uid, 30)
    slots = {schedule.slot_start(now - 30 * k, 30, offset): k for k in range(12)}
    by_slot = {slot: schedule.request_id(uid, slot) for slot in slots}
    posted = sorted(slot for slot, rid in by_slot.items() if rid in ids)
    assert len(posted) == len(ids), "an id of no slot of this Resource"
    assert posted == list(range(posted[0], posted[-1] + 1, 30)), posted  # none skipped
    assert len(posted) >= 3  # before, across and after the change of leader
    assert counted.reads(url) == len(posted)  # each slot's script once
    new = json.loads(
        cluster.kubectl("-n", NAMESPACE, "get", "lease", "tekton-controller", "-o", "json")
    )
    assert new["spec"]["holderIdentity"] != killed
    cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/tekton-controller", "--timeout=180s"
    )


@pytest.mark.bench
@pytest.mark.timeout(1800)
def test_many_resources_are_posted_spread_over_their_interval(
    users: CustomTask, counted: Counter, capsys
) -> None:
    """``SPREAD`` Resources of one interval: over two intervals, the requests the Broker took
    for them (its sink sees each) by second of arrival; the busiest second holds a small
    multiple of the mean (3x, or at the smoke size's few a second, the mean and four standard
    deviations and 3), where PingSources on one schedule post all in one second; and every
    Resource was checked."""
    cluster, d = users.cluster, users.deployment
    prefix = f"spread-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{n}" for n in range(SPREAD)]
    every = f"{SPREAD_EVERY}s"
    started = time.monotonic()
    for at in range(0, SPREAD, 200):
        made = [
            resource(n, TEAM_NAMESPACE, {"count": 1, "nonce": n}, every)
            for n in names[at : at + 200]
        ]
        apply(cluster, made)
    time.sleep(SPREAD_EVERY)  # the first slot of each: a backlog as they were created
    window = time.monotonic()
    time.sleep(2 * SPREAD_EVERY)
    ended = time.monotonic()
    subjects = {f"resource-functions.dev/resources/{TEAM_NAMESPACE}/{n}" for n in names}
    posts = [
        d.sink.arrival(e)
        for e in d.sink.events
        if e.get_attributes().get("subject") in subjects
        and e.get_type() == "dev.resourcefunctions.check.requested"
    ]
    in_window = [at for at in posts if window <= at < ended]
    seconds = Tally(int(at - window) for at in in_window)
    mean = len(in_window) / (ended - window)
    checked_ones = sum(
        1
        for item in json.loads(
            cluster.kubectl("-n", TEAM_NAMESPACE, "get", "resources", "-o", "json")
        )["items"]
        if item["metadata"]["name"].startswith(prefix) and (item.get("status") or {}).get("latest")
    )
    replicas = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", CONTROLLER, "-o", "name")
    cluster.kubectl("-n", TEAM_NAMESPACE, "delete", "resources", "--all", "--wait=false")
    with capsys.disabled():
        print(
            f"\n[resources] {SPREAD} Resources every {SPREAD_EVERY} s, {time.monotonic() - started:.0f} s: "
            f"{len(in_window)} checks posted in {ended - window:.0f} s, mean {mean:.1f}/s, "
            f"busiest second {max(seconds.values(), default=0)}; checked {checked_ones}; "
            f"controller replicas {len(replicas.split())}"
        )
    assert checked_ones == SPREAD
    assert len(in_window) >= 1.5 * SPREAD  # two intervals: each Resource about twice
    assert max(seconds.values()) <= max(3 * mean, mean + 4 * mean**0.5 + 3), seconds.most_common(5)
