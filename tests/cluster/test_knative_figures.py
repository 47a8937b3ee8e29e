"""Figures on the production path (printed; only correctness is asserted), side by side in
one run on the test cluster (Knative, the shipped ``knative/``):

- P6: a get through Broker → Trigger → Knative Service → Job → reply at the sink, against a
  bare Pod of the same image, script and stdin created through the API client and followed
  to ``Succeeded`` by a watch in this process; each phase of both (``timeline.py``);
- P4 on the cluster: a cache hit's round trip through the Broker, by phase;
- many runs at once: distinct gets (Jobs) and identical checks (warm pods, as shipped)
  through the Broker, a number in flight at a time: latency percentiles, runs per minute,
  the functions' API requests per run (the audit log), their watches and peak memory; every
  request answered exactly once, one ``version.discovered`` event per (resource, version),
  one check script run per resource, no Job left behind.

The shipped NetworkPolicies stay applied, but their enforcement (the test-only stand-in,
``network_policies.py``: a userspace verdict on each new connection) is turned off once P6
has been measured with it and without it: the rest is measured as a CNI that enforces in the
kernel would see it. The sink's Trigger retries here as the Broker's shipped delivery does (the
other modules' sink does not: it must show every failed delivery), so that a delivery the
Broker's data plane drops under load is retried rather than lost to the test; a request is
answered once when one reply event (one id) reaches the sink for it.

Benchmarks (``bench``): CI runs them at a smoke size; ``RF_BENCH=full`` at the size of
bench/README.md. Each size is also a variable of its own (full / smoke): ``RF_LOAD_GETS``
(100 / 10), ``RF_LOAD_RESOURCES`` (20 / 4), ``RF_LOAD_CHECKS_PER_RESOURCE`` (10 / 3),
``RF_LOAD_AT_ONCE`` (20 / 6); ``RF_P6_ROUNDS`` (5 / 1) and ``RF_P4_HITS`` (10 / 3).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from functions.runtimes.kube.job_plan import job_name
from tests.cluster.conftest import KNATIVE_CACHE_SECRET
from tests.cluster.node_processes import container_processes
from tests.cluster.test_knative_path import (
    LABEL,
    assert_reply,
    attributes,
    function_env,
    function_logs,
    post,
    reply_to,
    source,
)
from tests.cluster.timeline import (
    PodTimeline,
    admin_api,
    api_requests,
    audit_entries,
    bare_pod,
    function_lines,
    job_created,
    median,
    percentile,
    pod_timings,
    request_seen,
    stamp,
    wall,
)
from tests.support.bench import size
from tests.support.events import request_event
from tests.support.runs import run_of

RUN_ID = f"{LABEL}run-id"


@pytest.fixture(scope="module")
def sink_retries(knative_deployment):
    """The sink's Trigger with retries, as the Broker's shipped delivery has (knative/broker.yaml)."""
    d = knative_deployment
    trigger = json.loads(
        d.cluster.kubectl("-n", d.namespace, "get", "trigger", "test-sink", "-o", "json")
    )
    trigger["spec"]["delivery"] = {
        "retry": 5,
        "backoffPolicy": "exponential",
        "backoffDelay": "PT0.5S",
        "timeout": "PT10S",
    }
    for key in ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields"):
        trigger["metadata"].pop(key, None)
    trigger.pop("status", None)
    d.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(trigger))
    d.cluster.kubectl(
        "-n", d.namespace, "wait", "--for=condition=Ready", "trigger/test-sink", "--timeout=60s"
    )
    return d


@pytest.fixture
def unenforced(network_policies):
    """NetworkPolicy enforcement off for the rest of the module (the module's fixture turns
    it off again at its end: ``stop`` is idempotent)."""
    network_policies.stop()


def say(capsys, lines: list[str]) -> None:
    with capsys.disabled():
        print("\n" + "\n".join(f"[knative] {line}" for line in lines))


def get_data() -> dict:
    return {"type": "test", "source": source(), "version": {"ref": "1"}}


def run_of_event(event, action: str) -> str:
    got = attributes(event)
    return run_of(KNATIVE_CACHE_SECRET, got["source"], got["id"], action)


# --- P6 ---------------------------------------------------------------------------------------


def traced_get(d, timeline: PodTimeline) -> dict[str, float]:
    """One get through the Broker, and the marks of its way (wall-clock seconds)."""
    get = request_event("get", get_data())
    offset = d.cluster.audit_log.stat().st_size
    posted = time.time()
    assert post(d.broker, get)[0] == 202
    reply = reply_to(d, get, "get")
    arrived = wall(d.sink.arrival(reply))
    assert assert_reply(reply, get, "get")["cached"] is False
    run = run_of_event(get, "get")
    name, _ = timeline.labelled(RUN_ID, run)
    marks = timeline.wait(name, "succeeded")
    inside = pod_timings(marks.last)
    seen = request_seen(function_lines(function_logs(d, "get")), attributes(get)["id"])
    return {
        "posted": posted,
        "received": stamp(seen["time"]),
        "job_created": job_created(
            audit_entries(d.cluster.audit_log, offset), job_name("get", run)
        ),
        "created": marks.created,
        "scheduled": marks.scheduled,
        "script_start": inside["script"][0],
        "script_end": inside["script"][1],
        "collect_process": inside.get("collect_start", inside["script"])[1],
        "collect_main": inside["collect_import"][1],
        "reply_start": inside["reply"][0],
        "arrived": arrived,
        "succeeded": marks.succeeded,
    }


OURS_PHASES = (
    ("Broker to function (POST → the function's request line)", "posted", "received"),
    ("Job creation: the function (→ Job created, audit log)", "received", "job_created"),
    ("Job creation: the Job controller (→ pod seen)", "job_created", "created"),
    ("pod seen → bound to the node", "created", "scheduled"),
    ("bound → script starts (sandbox, network, init container)", "scheduled", "script_start"),
    ("the script", "script_start", "script_end"),
    ("stage and collect: script end → collect process (kubelet)", "script_end", "collect_process"),
    ("stage and collect: interpreter and imports", "collect_process", "collect_main"),
    ("stage and collect: upload, store", "collect_main", "reply_start"),
    # The in-memory channel answers the ingress (so the relay, so collect) only once every
    # subscriber has had the event: collect's POST lasts until the sink has it.
    ("reply to sink (collect → relay → Broker → sink)", "reply_start", "arrived"),
)
BARE_PHASES = (
    ("create call → pod seen", "posted", "created"),
    ("pod seen → bound to the node", "created", "scheduled"),
    ("bound → script starts (sandbox, network, container)", "scheduled", "script_start"),
    ("the script", "script_start", "script_end"),
    ("script end → Succeeded seen (kubelet, watch)", "script_end", "succeeded"),
)


def phase_lines(phases, runs: list[dict[str, float]], end: str) -> list[str]:
    lines = []
    for what, start, stop in phases:
        spent = [run[stop] - run[start] for run in runs]
        lines.append(
            f"  {median(spent) * 1000:7.0f} ms  {what}  {[round(s * 1000) for s in spent]}"
        )
    total = [run[end] - run["posted"] for run in runs]
    lines.append(f"  {median(total):7.2f} s   total  {[round(t, 2) for t in total]}")
    return lines


@pytest.mark.bench
def test_a_get_against_a_bare_pod(sink_retries, network_policies, cluster_images, capsys):
    """P6, with each phase of both (medians of RF_P6_ROUNDS rounds, alternating), with the
    NetworkPolicy enforcement stand-in on, then off."""
    d = sink_retries
    core = admin_api(d.cluster)
    lines: list[str] = []
    with PodTimeline(core, d.tasks_namespace) as timeline:
        traced_get(d, timeline)  # the get Service's cold start is not P6
        for enforced in (True, False):
            if not enforced:
                network_policies.stop()
            ours, bare = [], []
            for _ in range(size("RF_P6_ROUNDS", 5, 1)):
                data = get_data()
                payload = {"source": data["source"], "version": data["version"]}
                bare.append(bare_pod(core, timeline, cluster_images["resource"], payload))
                ours.append(traced_get(d, timeline))
            ours_total = median(run["arrived"] - run["posted"] for run in ours)
            bare_total = median(run["succeeded"] - run["posted"] for run in bare)
            title = f"NetworkPolicy enforcement (the test stand-in) {'on' if enforced else 'off'}"
            lines += [
                f"{title}, P6 ours: POST to the Broker → reply at the sink",
                *phase_lines(OURS_PHASES, ours, "arrived"),
                f"{title}, bare Pod: create → Succeeded seen by a watch",
                *phase_lines(BARE_PHASES, bare, "succeeded"),
                f"{title}: P6 overhead {ours_total - bare_total:+.2f} s "
                + f"({ours_total / bare_total:.2f}x)",
            ]
    say(capsys, lines)


# --- P4 on the cluster ------------------------------------------------------------------------


@pytest.mark.bench
def test_a_cache_hit_through_the_broker(sink_retries, unenforced, capsys):
    """A cache hit's round trip (P4 on the cluster), by phase: POST → the Broker's ingress
    (the request's ``knativearrivaltime``), → the function (its request line), → the
    ingress again (the reply's arrival time), → the sink."""
    d = sink_retries
    data = get_data()
    first = request_event("get", data)
    assert post(d.broker, first)[0] == 202
    assert_reply(reply_to(d, first, "get"), first, "get")
    hits: list[dict[str, float]] = []
    for _ in range(size("RF_P4_HITS", 10, 3)):
        hit = request_event("get", data)
        posted = time.time()
        status, held = post(d.broker, hit)
        assert status == 202
        reply = reply_to(d, hit, "get")
        assert assert_reply(reply, hit, "get")["cached"] is True
        (request,) = d.sink.wait(id=attributes(hit)["id"], type=attributes(hit)["type"])
        seen = request_seen(function_lines(function_logs(d, "get")), attributes(hit)["id"])
        hits.append(
            {
                "posted": posted,
                "ingress": stamp(request.get_extension("knativearrivaltime")),
                "function": stamp(seen["time"]),
                "replied": reply.get_time().timestamp(),
                "back": stamp(reply.get_extension("knativearrivaltime")),
                "arrived": wall(d.sink.arrival(reply)),
                "request_at_sink": wall(d.sink.arrival(request)),
                "held": held,
                "short_way": float(bool(seen.get("short_way"))),
            }
        )
    phases = (
        ("POST → Broker ingress", "posted", "ingress"),
        ("ingress → channel → filter → function (its request line)", "ingress", "function"),
        ("the function (its request line → its reply's time)", "function", "replied"),
        ("function → filter → ingress (the reply's arrival)", "replied", "back"),
        ("ingress → channel → filter → sink", "back", "arrived"),
    )
    lines = ["P4 on the cluster: a cache hit, POST → reply at the sink"]
    lines += phase_lines(phases, hits, "arrived")
    one_pass = [h["request_at_sink"] - h["ingress"] for h in hits]
    lines.append(
        f"  {median(one_pass) * 1000:7.0f} ms  one Broker pass without a function (ingress → sink)"
    )
    lines.append(
        f"  {median(h['held'] for h in hits) * 1000:7.0f} ms  the POST held (the channel's fan-out)"
    )
    lines.append(f"  short way: {sum(h['short_way'] for h in hits):.0f} of {len(hits)} hits")
    say(capsys, lines)


# --- many runs at once ------------------------------------------------------------------------


SENDER_TRIES = 5  # a Broker's 5xx means "retry": a sender posts the same event again
RETRIED: list[str] = []  # the id of each event posted again after a 5xx, once per retry


def drive(d, events: list, action: str, at_once: int) -> list[tuple[float, float]]:
    """Each event POSTed (again, after a pause, while the Broker answers 5xx: the same
    event, as a pipeline engine would; noted in ``RETRIED``) and its reply awaited,
    ``at_once`` in flight; (posted, latency)."""

    def one(event) -> tuple[float, float]:
        for attempt in range(SENDER_TRIES):
            posted = time.monotonic()  # the latency counts from the post that was taken
            status = post(d.broker, event)[0]
            if status < 500 or attempt == SENDER_TRIES - 1:
                break
            RETRIED.append(attributes(event)["id"])
            time.sleep(2**attempt)
        assert status == 202, status
        reply = reply_to(d, event, action, timeout=600)
        assert attributes(reply)["type"] == f"dev.resourcefunctions.{action}.succeeded", reply
        return posted, d.sink.arrival(reply) - posted

    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(one, events))


def latency_line(what: str, results: list[tuple[float, float]]) -> str:
    spent = [latency for _, latency in results]
    return (
        f"{what}: p50 {percentile(spent, 0.5):.2f} s, p95 {percentile(spent, 0.95):.2f} s "
        f"(p95/p50 {percentile(spent, 0.95) / percentile(spent, 0.5):.2f}), "
        f"min {min(spent):.2f} s, max {max(spent):.2f} s"
    )


def per_minute(results: list[tuple[float, float]], jobs: int) -> float:
    start = min(posted for posted, _ in results)
    end = max(posted + latency for posted, latency in results)
    return jobs / (end - start) * 60


def answers(d, events: list) -> dict[str, list]:
    """Every event at the sink answering one of ``events`` (discoveries aside), by request."""
    ids = {attributes(e)["id"] for e in events}
    found: dict[str, list] = {i: [] for i in ids}
    for event in d.sink.matching():
        got = attributes(event)
        if got.get("requestid") in ids and not got["type"].endswith(".discovered"):
            found[got["requestid"]].append(event)
    return found


def discoveries(d, events: list) -> dict[tuple[str, str], list[str]]:
    """The version.discovered event ids at the sink for ``events``, by (resource, version)."""
    ids = {attributes(e)["id"] for e in events}
    found: dict[tuple[str, str], list[str]] = {}
    for event in d.sink.matching(type="dev.resourcefunctions.version.discovered"):
        if attributes(event)["requestid"] in ids:
            data = event.get_data()
            key = (data["resource"], json.dumps(data["version"], sort_keys=True))
            found.setdefault(key, []).append(attributes(event)["id"])
    return found


def where_gets_waited(
    gets: list, got: list[tuple[float, float]], by_run: dict[str, dict], pods: list[dict]
) -> list[str]:
    """Each get's time split where the cluster records it (to the second): POST → its Job
    created (Broker, Trigger, function, retries), Job → its pod scheduled (the Job controller,
    the scheduler waiting for room on the node), scheduled → reply at the sink (the pod and
    the reply); medians, and the slowest gets one by one."""
    pod_of = {(p["metadata"].get("labels") or {}).get("job-name"): p for p in pods}
    rows = []
    for event, (posted, latency) in zip(gets, got, strict=True):
        job = by_run[run_of_event(event, "get")]
        pod = pod_of.get(job["metadata"]["name"])
        conditions = {c["type"]: c for c in (pod or {}).get("status", {}).get("conditions") or []}
        if "PodScheduled" not in conditions:
            continue  # its pod is gone (the Job's TTL): nothing to split
        created = stamp(job["metadata"]["creationTimestamp"])
        scheduled = stamp(conditions["PodScheduled"]["lastTransitionTime"])
        start = wall(posted)
        rows.append((latency, created - start, scheduled - created, start + latency - scheduled))
    if not rows:
        return ["gets by phase: no pod left to read"]
    names = ("POST → Job created", "Job → pod scheduled", "scheduled → reply at the sink")
    lines = [
        f"gets by phase ({len(rows)} with their pod), medians: "
        + ", ".join(f"{n} {median(r[i + 1] for r in rows):.1f} s" for i, n in enumerate(names))
    ]
    slowest = sorted(rows, reverse=True)[: max(1, len(rows) // 20)]
    for total, *parts in slowest:
        split = ", ".join(f"{n} {v:.0f} s" for n, v in zip(names, parts, strict=True))
        lines.append(f"  slow get, {total:.0f} s: {split}")
    return lines


def scheduler_said(core, namespace: str, node: dict) -> list[str]:
    """Why the scheduler kept task pods waiting (its FailedScheduling events, by message) and
    the node's room: allocatable CPU and pods against what the pods on it request."""
    events = json.loads(core.list_namespaced_event(namespace, _preload_content=False).data)
    said: Counter[str] = Counter()
    pods = set()
    for event in events["items"]:
        if event.get("reason") == "FailedScheduling":
            said[event.get("message", "").strip()] += event.get("count") or 1
            pods.add((event.get("involvedObject") or {}).get("name"))
    lines = [f"scheduler, {n} times: {message}" for message, n in said.most_common(3)]
    allocatable = node["status"]["allocatable"]
    lines.append(
        f"node: allocatable cpu {allocatable['cpu']}, pods {allocatable['pods']}; "
        f"task pods the scheduler turned away at least once: {len(pods)}"
    )
    return lines


def function_memory(d) -> list[str]:
    """Each function pod's peak memory: the largest VmHWM (peak RSS) of its processes (the
    gunicorn worker), their sum, and its memory cgroup's max_usage_in_bytes (page cache
    included). The pods' containers are processes of this machine."""
    pods = json.loads(d.cluster.kubectl("-n", d.namespace, "get", "pods", "-o", "json"))["items"]
    lines = []
    for pod in pods:
        service = (pod["metadata"].get("labels") or {}).get("serving.knative.dev/service")
        if service not in ("check", "get", "put"):
            continue
        for status in pod["status"].get("containerStatuses") or []:
            if status["name"] == "function" and status.get("containerID"):
                container = status["containerID"].split("//")[-1]
                lines.append(f"{service} {pod['metadata']['name']}: {container_memory(container)}")
    return lines


def container_memory(container: str) -> str:
    peaks, cgroup = [], ""
    for proc, groups in container_processes(container):
        try:
            status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
            peaks.append(int(status["VmHWM"].split()[0]) / 1024)
            cgroup = next(
                line.split(":", 2)[2] for line in groups.splitlines() if ":memory:" in line
            )
        except (OSError, KeyError, StopIteration, ValueError):
            continue
    usage = Path(f"/sys/fs/cgroup/memory{cgroup}/memory.max_usage_in_bytes")
    peak = f"{int(usage.read_text()) / 2**20:.0f} MiB" if cgroup and usage.exists() else "?"
    if not peaks:
        return "no process found"
    return (
        f"peak RSS {max(peaks):.0f} MiB (largest process), {sum(peaks):.0f} MiB "
        f"({len(peaks)} processes); cgroup peak {peak}"
    )


@pytest.mark.bench
@pytest.mark.timeout(1800)
def test_many_runs_at_once(sink_retries, unenforced, counted, capsys):
    """Distinct gets, then identical checks of a few resources (``check_every`` set, as
    Concourse sends it), through the Broker, ``RF_LOAD_AT_ONCE`` awaiting their reply at a
    time. Left behind, after every reply and a settling pause: a Job of the load not
    ``Complete`` (running, failed, or without ``ttlSecondsAfterFinished``), a pod of one not
    ``Succeeded``. A stdin Secret its function did not delete (its replica was scaled down
    while following the task: Knative counts requests, not a replica's background work) is
    counted; its Job owns it, so it goes with the Job at the Job's TTL."""
    d = sink_retries
    gets_n, resources_n = size("RF_LOAD_GETS", 100, 10), size("RF_LOAD_RESOURCES", 20, 4)
    each, at_once = size("RF_LOAD_CHECKS_PER_RESOURCE", 10, 3), size("RF_LOAD_AT_ONCE", 20, 6)
    # These figures are a capacity's, not a team's share: one team sends it all, so its
    # MAX_RUNS_PER_TEAM (8 per replica) is raised above the load (tests/cluster/
    # test_teams_on_kubernetes.py shows the limit; past the Broker's retries a 429 is
    # dead-lettered).
    for service in ("get", "check"):
        function_env(d, service, "MAX_RUNS_PER_TEAM", str(4 * at_once))
    drive(d, [request_event("get", get_data())], "get", 1)  # both Services up: no cold start
    drive(d, [request_event("check", {"type": "test", "source": source()})], "check", 1)
    offset, started = d.cluster.audit_log.stat().st_size, time.time()

    gets = [request_event("get", get_data()) for _ in range(gets_n)]
    got = drive(d, gets, "get", at_once)
    sources = [source(count_url=counted.url_for(uuid.uuid4().hex)) for _ in range(resources_n)]
    checks = [
        request_event("check", {"type": "test", "source": src, "check_every": 600})
        for src in sources
        for _ in range(each)
    ]
    checked = drive(d, checks, "check", at_once)
    memory = function_memory(d)
    time.sleep(15)  # late doubles would arrive; the followers end

    # Every request answered exactly once, every version announced once.
    replied = {**answers(d, gets), **answers(d, checks)}
    for request, replies in replied.items():
        assert len({attributes(r)["id"] for r in replies}) == 1, (request, replies)
    redelivered = sum(len(replies) - 1 for replies in replied.values())
    found = discoveries(d, checks)
    assert len(found) == resources_n * 3, len(found)  # the test resource's versions 1..3
    assert all(len(ids) == 1 for ids in found.values()), found

    # One Job per get, none left behind; the checks ran in warm pods (as shipped), one script
    # run per resource (the others answered from its result).
    core = admin_api(d.cluster)
    listed = json.loads(d.cluster.kubectl("-n", d.tasks_namespace, "get", "jobs", "-o", "json"))
    by_run = {j["metadata"]["labels"].get(RUN_ID): j for j in listed["items"]}
    get_jobs = [by_run.get(run_of_event(e, "get")) for e in gets]
    assert all(get_jobs), "a get without its Job"
    check_jobs = [by_run[r] for r in {run_of_event(e, "check") for e in checks} if r in by_run]
    assert check_jobs == [], [j["metadata"]["name"] for j in check_jobs]
    assert [counted.reads(s["count_url"]) for s in sources] == [1] * resources_n
    jobs = get_jobs
    for job in jobs:
        conditions = {c["type"]: c["status"] for c in job["status"].get("conditions") or []}
        assert conditions.get("Complete") == "True", (job["metadata"]["name"], job["status"])
        assert job["spec"].get("ttlSecondsAfterFinished"), job["metadata"]["name"]
    names = {j["metadata"]["name"] for j in jobs}
    pods = json.loads(core.list_namespaced_pod(d.tasks_namespace, _preload_content=False).data)
    node = json.loads(core.list_node(_preload_content=False).data)["items"][0]
    for pod in pods["items"]:
        if pod["metadata"].get("labels", {}).get("job-name") in names:
            assert pod["status"]["phase"] == "Succeeded", pod["metadata"]["name"]
    secrets = json.loads(
        core.list_namespaced_secret(d.tasks_namespace, _preload_content=False).data
    )
    uids = {j["metadata"]["uid"] for j in jobs}
    left = [s for s in secrets["items"] if s["metadata"]["name"] in {f"{n}-stdin" for n in names}]
    for secret in left:  # goes with its Job
        owners = {o["uid"] for o in secret["metadata"].get("ownerReferences") or []}
        assert owners & uids, secret["metadata"]["name"]

    counts, most_watches, replicas = api_requests(audit_entries(d.cluster.audit_log, offset))
    total, load = sum(counts.values()), os.getloadavg()
    verbs = ", ".join(f"{v} {r} {n / len(jobs):.2f}" for (v, r), n in sorted(counts.items()))
    heading = (
        f"many runs at once: {gets_n} gets, then {resources_n * each} checks of "
        f"{resources_n} resources, {at_once} in flight; {time.time() - started:.0f} s; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    rates = (
        f"runs per minute: gets (Jobs) {per_minute(got, gets_n):.1f}, checks "
        f"{per_minute(checked, resources_n):.1f} ({resources_n} warm runs for {len(checks)} "
        "checks)"
    )
    say(
        capsys,
        [
            heading,
            latency_line("gets (POST → reply at the sink)", got),
            latency_line("checks (POST → reply at the sink)", checked),
            rates,
            f"API requests of the functions: {total} for {len(jobs)} Jobs, "
            + f"{total / len(jobs):.2f} per run; per run by verb: {verbs}",
            f"watches: {counts.get(('watch', 'pods'), 0)} requests, "
            + f"at most {most_watches} open at once, from {replicas} function replicas",
            f"reply events delivered again (same id): {redelivered}; stdin Secrets left to "
            + f"their Job's TTL: {len(left)} of {len(jobs)}; posts the Broker answered 5xx "
            + f"(sent again): {len(RETRIED)}",
            *where_gets_waited(gets, got, by_run, pods["items"]),
            *scheduler_said(core, d.tasks_namespace, node),
            *memory,
        ],
    )
