"""The production path on the test cluster: real Knative Eventing and Serving.

``knative/`` is applied with ``kubectl apply -k`` (image and config overrides only). Request
events go to the Broker's ingress as a pipeline engine would send them; the shipped Triggers
deliver them to the three Knative Services (through the test KIngress and the activator); the
functions run Jobs through in-cluster config under the shipped RBAC; replies go back into the
Broker and reach a sink on this machine through a Trigger. Tests run in file order; each uses
its own sources, so that no cache hit or redelivery crosses tests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import requests
import yaml
from cloudevents.core.v1.event import CloudEvent

from functions.cli.launch import NotReady, wait_until
from functions.runtimes.labels import WARM_POD_KEY_LABEL
from testbed import event_sink as sinks
from testbed.kubernetes import GATEWAY
from testbed.kubernetes.knative import min_scale
from tests.cluster.conftest import KNATIVE_CACHE_SECRET, REPO, wait_functions_serve, wait_ready
from tests.cluster.counter import Counter
from tests.support.events import ENCODERS, request_event
from tests.support.runs import run_of

LABEL = "resource-functions.dev/"
WARM_POD = WARM_POD_KEY_LABEL  # a selector: every warm check pod
REPLY_SOURCE = "/resource-functions/{action}"


def post(url: str, event, mode: str = "binary") -> tuple[int, float]:
    """POST an event to the Broker; returns the status and how long the sender was held."""
    message = ENCODERS[mode](event)
    started = time.monotonic()
    response = requests.post(url, headers=dict(message.headers), data=message.body, timeout=300)
    return response.status_code, time.monotonic() - started


def parallel_post(url: str, event) -> Future:
    """``post`` in a thread: a Future of its status and how long the sender was held."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(post, url, event)
    finally:
        pool.shutdown(wait=False)


def source(**extra: object) -> dict:
    return {"uri": "https://git.example.com/repo.git", "nonce": uuid.uuid4().hex, **extra}


def run_of_request(event) -> str:
    """The run id of a request as the functions name it (no sender authentication): the team
    it names, its source, id and action."""
    action = attributes(event)["type"].split(".")[2]
    data = event.get_data() if isinstance(event.get_data(), dict) else json.loads(event.get_data())
    team = (data.get("build") or {}).get("team", "")
    got = attributes(event)
    return run_of(KNATIVE_CACHE_SECRET, got["source"], got["id"], action, team=team)


def jobs_of(deployment, event) -> list[dict]:
    """The Jobs started for this request (labelled with its run id)."""
    return deployment.jobs(**{f"{LABEL}run-id": run_of_request(event)})


def ran_warm(deployment, run: str) -> bool:
    """The run ``run`` (a check, as shipped: WARM_CHECKS=on) ran in a warm pod: its result is
    recorded under its run id and no Job of that run exists (a Job is the other way a run
    records one; a warm check leaves no object of its own)."""
    from functions.ledger import results

    recorded = results.read_outcome(deployment.store, run, request=None) is not None
    return recorded and deployment.jobs(**{f"{LABEL}run-id": run}) == []


def attributes(event) -> dict:
    return event.get_attributes()


def assert_reply(reply, request, action: str, outcome: str = "succeeded") -> dict:
    """The reply's attributes follow the event contract; returns its data."""
    got = attributes(reply)
    assert got["type"] == f"dev.resourcefunctions.{action}.{outcome}", reply.get_data()
    assert got["source"] == REPLY_SOURCE.format(action=action)
    assert got["requestid"] == attributes(request)["id"]
    assert got.get("subject") == attributes(request).get("subject")
    assert got["datacontenttype"] == "application/json"
    data = reply.get_data()
    return data if isinstance(data, dict) else json.loads(data)


def reply_to(deployment, request, action: str, timeout: float = 180):
    """The reply to ``request``; a check's version.discovered events share its requestid and
    come first, so they are passed over."""
    deadline, count = time.monotonic() + timeout, 1
    while True:
        left = max(1.0, deadline - time.monotonic())
        found = deployment.sink.wait(timeout=left, count=count, requestid=attributes(request)["id"])
        replies = [e for e in found if not attributes(e)["type"].endswith(".discovered")]
        if replies:
            return replies[0]
        count = len(found) + 1


def function_logs(deployment, service: str) -> str:
    return deployment.cluster.kubectl(
        "-n",
        deployment.namespace,
        "logs",
        "-l",
        f"serving.knative.dev/service={service}",
        "-c",
        "function",
        "--tail=-1",
        "--prefix",
        check=False,
    )


def test_check_get_put_travel_the_broker_and_reply_through_a_trigger(knative_deployment, counted):
    """A check, then a get and a put of its version. As shipped (WARM_CHECKS=on) the check
    runs in a warm pod, its script once; the get and the put run as a Job each."""
    d = knative_deployment
    src = source(count_url=counted.url_for(uuid.uuid4().hex))
    check = request_event("check", {"type": "test", "source": src}, subject="main/repo")
    assert post(d.broker, check)[0] == 202
    versions = assert_reply(reply_to(d, check, "check"), check, "check")["versions"]
    assert versions == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]

    get = request_event(
        "get",
        {
            "type": "test",
            "source": src,
            "version": versions[-1],
            "build": {"id": "7", "name": "42", "job": "unit", "pipeline": "main", "team": "main"},
        },
        subject="main/repo",
    )
    assert post(d.broker, get, mode="structured")[0] == 202
    data = assert_reply(reply_to(d, get, "get"), get, "get")
    assert data["version"] == {"ref": "3"}
    assert data["cached"] is False
    assert data["metadata"] == [{"name": "build", "value": "7"}]
    artifact = data["artifact"]
    key = artifact["url"][len(d.store.url.rstrip("/")) + 1 :]
    with d.store.open(key) as stream:
        stored = stream.read()
    assert artifact["digest"] == "sha256:" + hashlib.sha256(stored).hexdigest()
    assert artifact["size"] == len(stored)
    assert artifact["format"] == "tar+zstd"

    put = request_event(
        "put",
        {
            "type": "test",
            "source": src,
            "params": {"input": "in"},
            "inputs": {"in": artifact["url"]},
            # The get's team: an artifact is its team's (another team's put is refused 403).
            "build": {"id": "7", "name": "42", "job": "unit", "pipeline": "main", "team": "main"},
        },
    )
    assert post(d.broker, put)[0] == 202
    data = assert_reply(reply_to(d, put, "put"), put, "put")
    assert data["version"] == {"ref": "pushed-3"}
    assert set(data) == {"version", "metadata"}
    assert ran_warm(d, run_of_request(check)) and counted.reads(src["count_url"]) == 1
    assert len(jobs_of(d, get)) == len(jobs_of(d, put)) == 1


def test_a_repeated_get_is_a_cache_hit_without_a_job(knative_deployment):
    d = knative_deployment
    data = {"type": "test", "source": source(), "version": {"ref": "2"}}
    first = request_event("get", data)
    assert post(d.broker, first)[0] == 202
    assert assert_reply(reply_to(d, first, "get"), first, "get")["cached"] is False
    again = request_event("get", data)
    assert post(d.broker, again)[0] == 202
    hit = assert_reply(reply_to(d, again, "get"), again, "get")
    assert hit["cached"] is True
    assert jobs_of(d, again) == []
    assert len(jobs_of(d, first)) == 1
    # Once a replica keeps the record, a repeat delivered by the Broker (its arrival time,
    # trace context and a new id) is answered by the short way in front of Flask: the same
    # reply. (With several replicas a repeat may reach one that has not kept it yet.)
    lines = []
    for _ in range(4):
        repeat = request_event("get", data)
        assert post(d.broker, repeat)[0] == 202
        assert assert_reply(reply_to(d, repeat, "get"), repeat, "get") == hit
        lines.append(request_line(d, "get", attributes(repeat)["id"]))
        if lines[-1].get("short_way") is True:
            break
    assert lines[-1].get("short_way") is True, lines


def request_line(deployment, service: str, event_id: str) -> dict:
    """The function's ``request`` log line of an event (from any of its pods)."""

    def find() -> dict | None:
        for text in function_logs(deployment, service).splitlines():
            _, _, body = text.partition("] ")
            if f'"{event_id}"' in body:
                line = json.loads(body)
                if line.get("message") == "request" and line.get("id") == event_id:
                    return line
        return None

    return wait_until(find, f"the request line of {event_id}", 30, interval=0.5)


def test_a_twice_delivered_event_runs_once_and_gives_one_result(knative_deployment):
    d = knative_deployment
    get = request_event("get", {"type": "test", "source": source(delay=3), "version": {"ref": "1"}})
    assert post(d.broker, get)[0] == 202
    assert post(d.broker, get)[0] == 202
    # Async: a delivery that finds the run under way is accepted (202) and the task replies
    # once; one that finds it finished gets the stored reply again. Either way: one result.
    replies = d.sink.wait(requestid=attributes(get)["id"])
    time.sleep(5)  # room for a second reply, if one comes
    replies = d.sink.matching(requestid=attributes(get)["id"])
    assert len({attributes(r)["id"] for r in replies}) == 1
    assert all(r.get_data() == replies[0].get_data() for r in replies)
    assert assert_reply(replies[0], get, "get")["version"] == {"ref": "1"}
    assert len(jobs_of(d, get)) == 1


def block_store(deployment, on: bool) -> None:
    """Make the S3 server refuse connections from the pods (a store outage), or undo it."""
    from urllib.parse import urlsplit

    from testbed.kubernetes import BRIDGE

    address = urlsplit(deployment.s3.endpoint)
    rule = ["INPUT", "-i", BRIDGE, "-d", str(address.hostname), "-p", "tcp"]
    rule += ["--dport", str(address.port), "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run(["iptables", "-w", "-I" if on else "-D", *rule], check=True)


def knative_log(deployment, selector: str, since: str = "10m") -> str:
    """The timestamped log of a Knative data-plane component (its pods stay up)."""
    namespace, _, label = selector.partition(":")
    return deployment.cluster.kubectl(
        "-n",
        namespace,
        "logs",
        "-l",
        label,
        f"--since={since}",
        "--timestamps",
        "--prefix",
        check=False,
    )


FILTER = "knative-eventing:eventing.knative.dev/brokerRole=filter"
DISPATCHER = "knative-eventing:messaging.knative.dev/role=dispatcher"
ACTIVATOR = "knative-serving:app=activator"


def outage_report(deployment, timeline: dict[str, float]) -> str:
    """When each hop saw the outage's deliveries: the Broker filter's and the channel
    dispatcher's attempts, the activator, the get function."""
    since = f"{int(time.time() - timeline['blocked']) + 30}s"
    marks = {k: time.strftime("%H:%M:%S", time.gmtime(v)) for k, v in timeline.items()}
    logs = [f"{marks}"]
    for selector in (FILTER, DISPATCHER, ACTIVATOR):
        logs.append(f"--- {selector}\n{knative_log(deployment, selector, since)[-6000:]}")
    logs.append(f"--- get\n{function_logs(deployment, 'get')[-6000:]}")
    return "\n".join(logs)


def test_a_store_outage_answers_503_and_the_broker_retry_runs_once(knative_deployment):
    d = knative_deployment
    # Warm: the outage, not a cold start, is what the first delivery meets.
    warm = request_event("get", {"type": "test", "source": source(), "version": {"ref": "1"}})
    assert post(d.broker, warm)[0] == 202
    assert_reply(reply_to(d, warm, "get"), warm, "get")
    get = request_event("get", {"type": "test", "source": source(), "version": {"ref": "1"}})
    refused = (
        "get.resource-functions.svc.cluster.local: unexpected HTTP response, expected 2xx, got 503"
    )
    timeline = {"blocked": time.time()}
    try:
        block_store(d, True)
        try:
            # In a thread: the in-memory channel answers the Broker's ingress, and so the
            # producer, only when its subscribers' deliveries, retries included, have ended.
            sent = parallel_post(d.broker, get)
            timeline["posted"] = time.time()
            # The first delivery meets the outage: the function answers 503, starts nothing.
            wait_until(
                lambda: refused in knative_log(d, FILTER, "60s"), "answered 503", 60, interval=0.5
            )
            timeline["refused"] = time.time()
            assert jobs_of(d, get) == []
        finally:
            block_store(d, False)
            timeline["unblocked"] = time.time()
            unblocked = time.monotonic()
        # The Broker retries (delays doubling from PT2S): a retry after the outage runs once.
        reply = reply_to(d, get, "get", timeout=120)
        status, held = sent.result(timeout=120)
        assert status == 202
    except AssertionError as err:
        raise AssertionError(f"{err}\n{outage_report(d, timeline)}") from err
    print(
        f"\n[knative] store outage: refused {timeline['refused'] - timeline['posted']:.1f}s "
        f"after the post, replied {d.sink.arrival(reply) - unblocked:.1f}s after the outage; "
        f"the producer was held {held:.1f}s"
    )
    data = assert_reply(reply, get, "get")
    assert data["cached"] is False
    assert len(d.sink.matching(requestid=attributes(get)["id"])) == 1
    assert len(jobs_of(d, get)) == 1


def test_async_reply_is_posted_by_the_task_through_the_reply_relay(knative_deployment):
    """A get's Job posts its reply itself (its collect step, through the relay). An async
    warm check posts its own before its 202 (tests/cluster/test_warm_pods.py)."""
    d = knative_deployment
    get = request_event(
        "get",
        {"type": "test", "source": source(), "version": {"ref": "2"}},
        replymode="async",
        subject="async/repo",
    )
    assert post(d.broker, get)[0] == 202
    reply = reply_to(d, get, "get")
    data = assert_reply(reply, get, "get")
    assert data["version"] == {"ref": "2"}
    (job,) = jobs_of(d, get)
    collect = next(
        c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "collect"
    )
    sink = [e["value"] for e in collect.get("env", []) if e["name"] == "K_SINK"]
    assert sink == [f"http://reply-relay.{d.namespace}.svc.cluster.local"], sink
    relayed = d.cluster.kubectl(  # every replica's log: either may have taken it
        "-n", d.namespace, "logs", "-l", "app.kubernetes.io/component=reply-relay", "--tail=-1"
    )
    assert reply.get_id() in relayed  # the relay forwarded it to the Broker


TEAM_REPLIES = REPO / "knative" / "examples" / "team-replies.yaml"


def team_check(team: str):
    """An async check of team ``team`` from the version history: it announces each version
    it finds (``version.discovered``) before its reply, both posted by its warm check's
    function (by a Job's collect, through the relay, when WARM_CHECKS=off)."""
    data = {"type": "test", "source": source(), "version": "latest-known", "build": {"team": team}}
    return request_event("check", data, replymode="async")


def answers(deployment, request, discovered: int) -> list:
    """``request``'s reply and its ``discovered`` version.discovered events, at the sink."""
    from functions.replies import DISCOVERED_TYPE

    reply = reply_to(deployment, request, "check")
    found = deployment.sink.wait(
        timeout=60, count=discovered, type=DISCOVERED_TYPE, requestid=attributes(request)["id"]
    )
    return [*found, reply]


def test_a_teams_trigger_takes_its_teams_replies_and_discoveries_alone(knative_deployment):
    """The shipped example's team Trigger (``knative/examples/team-replies.yaml``, its
    filters as shipped; its subscriber, standing in for team main's engine, a sink on this
    machine). An async check of team other, then one of team main: each posts its versions
    (three ``version.discovered``) and its reply, each event with its request's ``team``
    attribute (``build.team``). Team main's Trigger takes
    team main's four events and nothing of team other's, which had reached the Broker (the
    catch-all sink) before team main's check was sent."""
    d = knative_deployment
    docs = list(yaml.safe_load_all(TEAM_REPLIES.read_text()))
    trigger = next(doc for doc in docs if doc["kind"] == "Trigger")
    name = trigger["metadata"]["name"]
    with sinks.event_sink(GATEWAY) as engine:
        trigger["spec"]["subscriber"] = {"uri": engine.url}
        d.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(trigger))
        try:
            wait_ready(d.cluster, d.namespace, [f"trigger/{name}"])
            other = team_check("other")
            assert post(d.broker, other)[0] == 202
            of_other = answers(d, other, 3)
            main = team_check("main")
            assert post(d.broker, main)[0] == 202
            of_main = answers(d, main, 3)
            taken = engine.wait(timeout=60, count=4, requestid=attributes(main)["id"])
        finally:
            d.cluster.kubectl("-n", d.namespace, "delete", "trigger", name, check=False)

    assert [e.get_extension("team") for e in of_other] == ["other"] * 4
    assert [e.get_extension("team") for e in of_main] == ["main"] * 4
    assert sorted(e.get_id() for e in taken) == sorted(e.get_id() for e in of_main)
    assert engine.matching(requestid=attributes(other)["id"]) == []
    assert {e.get_extension("team") for e in engine.events} == {"main"}
    # As shipped both ran in warm pods: their functions posted these events, before the 202.
    assert ran_warm(d, run_of_request(main)) and ran_warm(d, run_of_request(other))


PING = "dev.knative.sources.ping"
DISCOVERED = "dev.resourcefunctions.version.discovered"


def test_the_pingsource_example_reports_a_commit_between_two_ticks(knative_deployment):
    """The shipped example (its schedule set to every 20 seconds: PingSource takes a seconds
    field): each tick checks from the history ("version": "latest-known"); a commit between
    two ticks comes out as one version.discovered event, through the Broker, with the reply of
    the first tick that saw it."""
    d = knative_deployment
    docs = list(yaml.safe_load_all((REPO / "knative/examples/pingsource-check.yaml").read_text()))
    ping = next(doc for doc in docs if doc["kind"] == "PingSource")
    shipped = json.loads(ping["spec"]["data"])
    assert shipped["version"] == "latest-known"
    repository = Counter(2)
    ping["spec"]["schedule"] = "*/20 * * * * *"  # fires within the test
    ping["spec"]["data"] = json.dumps(
        {**shipped, "type": "test", "source": source(count_url=repository.url)}
    )
    tick_source = f"/apis/v1/namespaces/{d.namespace}/pingsources/{ping['metadata']['name']}"
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    d.cluster.kubectl("apply", "-f", "-", stdin=listed)

    def discoveries_of_three() -> list:
        """version.discovered events of ref 3 that a tick of this PingSource's made."""
        ticks = {attributes(t)["id"] for t in d.sink.matching(type=PING, source=tick_source)}
        return [
            e
            for e in d.sink.matching(type=DISCOVERED)
            if attributes(e).get("requestid") in ticks and e.get_data()["version"] == {"ref": "3"}
        ]

    try:
        # The ticks reach the sink too (its Trigger takes every event).
        first = d.sink.wait(timeout=90, type=PING, source=tick_source)[0]
        reply = reply_to(d, first, "check", timeout=120)
        assert attributes(reply)["type"] == "dev.resourcefunctions.check.succeeded"
        assert reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}]
        assert reply.get_data()["new"] == [{"ref": "1"}, {"ref": "2"}]
        repository.value = 3  # a commit
        # Whichever tick first checks after the commit discovers it (a tick fired just before
        # may be the one, its Job reading the repository after the commit).
        (found,) = wait_until(
            discoveries_of_three, "a tick discovers the commit", 150, interval=0.5
        )
        second = d.sink.matching(id=attributes(found)["requestid"], source=tick_source)[0]
        reply = reply_to(d, second, "check", timeout=120)
        assert reply.get_data()["versions"] == [{"ref": "2"}, {"ref": "3"}]
        assert reply.get_data()["new"] == [{"ref": "3"}]
        assert found.get_data()["version"] == {"ref": "3"}
        assert "count_url" not in json.dumps(found.get_data())  # no source in events
        # The ticks' tasks held their resource's check lease (async replies) and let it go
        # once they had recorded: the next tick takes it at once. The PingSource goes first,
        # so that no tick holds it when it is read.
        d.cluster.kubectl("delete", "-f", "-", stdin=listed, check=False)
        from functions import keys
        from functions.ledger import lease

        key = keys.lease_record_key(found.get_data()["resource"])
        claim = wait_until(
            lambda: (c := lease.read(d.store, key)) and c.lease.released and c,
            "the check lease let go",
            60,
            interval=0.5,
        )
        ticks = d.sink.matching(type=PING, source=tick_source)
        runs = {
            run_of(KNATIVE_CACHE_SECRET, tick_source, attributes(t)["id"], "check") for t in ticks
        }
        assert claim.lease.run in runs
    finally:
        d.cluster.kubectl("delete", "-f", "-", stdin=listed, check=False)
        repository.close()


def typed_trigger(name: str, namespace: str, kind: str, uri: str) -> dict:
    """A Trigger taking the events of type ``kind`` to ``uri``, with no delivery of its own:
    the shipped Broker's retries and dead-letter sink apply."""
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "broker": "default",
            "filter": {"attributes": {"type": kind}},
            "subscriber": {"uri": uri},
        },
    }


def typed_event(kind: str, prefix: str) -> CloudEvent:
    """An empty event of type ``kind`` with a new id starting with ``prefix``."""
    attributes = {
        "specversion": "1.0",
        "type": kind,
        "id": f"{prefix}-{uuid.uuid4().hex[:8]}",
        "source": "/tests/pipeline",
        "datacontenttype": "application/json",
    }
    return CloudEvent(attributes=attributes, data={})


TEAM_NAMESPACE = "concourse-main"  # CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX + team
FUNCTIONS = "system:serviceaccount:resource-functions:resource-functions"


def can_i(deployment, verb: str, namespace: str) -> str:
    done = deployment.cluster.run_kubectl(
        "auth", "can-i", verb, "secrets", "-n", namespace, "--as", FUNCTIONS
    )
    return done.stdout.strip()


def test_credentials_by_reference_come_from_team_secrets_and_appear_nowhere(knative_deployment):
    """((var)) resolved by the function from Secrets in the team's namespace, under the
    shipped RBAC (knative/teams/ binds get, never list); the values reach the script and
    nothing else a user or operator can read."""
    from tests.support.services import CANARY

    d = knative_deployment
    d.cluster.kubectl("create", "namespace", TEAM_NAMESPACE, check=False)
    d.cluster.kubectl("apply", "-k", str(REPO / "knative" / "teams"))
    for name, data in {"git": {"password": CANARY}, "mode": {"value": "fail"}}.items():
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": TEAM_NAMESPACE},
            "stringData": data,
        }
        d.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    assert can_i(d, "get", TEAM_NAMESPACE) == "yes"
    assert can_i(d, "list", TEAM_NAMESPACE) == "no"
    assert can_i(d, "watch", TEAM_NAMESPACE) == "no"
    assert can_i(d, "get", "concourse-other") == "no"

    check = request_event(
        "check",
        {
            "type": "test",
            "build": {"team": "main", "pipeline": "p", "id": "1"},
            "source": source(mode="((mode))", password="((git.password))"),
        },
    )
    assert CANARY not in json.dumps(check.get_data())
    assert post(d.broker, check)[0] == 202
    data = assert_reply(reply_to(d, check, "check"), check, "check", "failed")
    # mode=fail reached the script (it fails as that mode does) and the values were redacted
    assert data["error"]["kind"] == "resource_failed" and data["error"]["exit_code"] == 3
    assert "mode=[redacted] password=[redacted]" in data["error"]["log_tail"]

    assert ran_warm(d, run_of_request(check))  # as shipped; its pod serves team main's checks
    warm = ("-n", d.tasks_namespace, "-l", WARM_POD)
    readable = {
        "events at the sink": "\n".join(json.dumps(e.get_data()) for e in d.sink.events),
        "function logs": function_logs(d, "check"),
        "warm pods' logs": d.cluster.kubectl(
            "logs", *warm, "--all-containers", "--tail=-1", "--prefix", check=False
        ),
        "task namespace's pods": d.cluster.kubectl(
            "-n", d.tasks_namespace, "get", "pods", "-o", "json"
        ),
        "Jobs": d.cluster.kubectl("-n", d.tasks_namespace, "get", "jobs", "-o", "json"),
        "Kubernetes events": d.cluster.kubectl("get", "events", "-A", "-o", "json", check=False),
        "store": "\n".join(
            d.store.open(key).read().decode(errors="replace") for key in d.store.list("")
        ),
    }
    assert "mode=[redacted] password=[redacted]" in readable["store"]  # the run's stored log
    for where, text in readable.items():
        assert CANARY not in text, where
        assert "mode=fail" not in text, where


def revision_pods(deployment, service: str) -> list[str]:
    out = deployment.cluster.kubectl(
        "-n",
        deployment.namespace,
        "get",
        "pods",
        "-l",
        f"serving.knative.dev/service={service}",
        "-o",
        "name",
        check=False,
    )
    return out.split()


def test_the_first_event_after_scale_to_zero_is_answered(knative_deployment, capsys):
    d = knative_deployment
    wait_until(lambda: not revision_pods(d, "check"), "scaled to zero", 180, interval=0.5)
    check = request_event("check", {"type": "test", "source": source()})
    started = time.monotonic()
    assert post(d.broker, check)[0] == 202
    reply = reply_to(d, check, "check")
    assert_reply(reply, check, "check")
    with capsys.disabled():
        print(
            f"\n[knative] check from zero replicas: {d.sink.arrival(reply) - started:.2f}s "
            "from the POST to the Broker to the reply at the sink"
        )


def test_a_long_get_never_holds_the_sender(knative_deployment):
    """The shipped reply mode answers the Broker at once; the reply comes later."""
    d = knative_deployment
    delay = 15
    get = request_event(
        "get", {"type": "test", "source": source(delay=delay), "version": {"ref": "1"}}
    )
    status, held = post(d.broker, get)
    assert status == 202
    assert held < delay / 3, f"the sender was held {held:.1f}s by a {delay}s get"
    assert_reply(reply_to(d, get, "get"), get, "get")


class Prober:
    """A busybox pod (the test resource image) in a namespace, to probe connections from:
    ``nc -e true`` connects and exits, a dropped SYN times out after 2 s."""

    def __init__(self, deployment, namespace: str, image: str) -> None:
        self.cluster, self.namespace = deployment.cluster, namespace
        self.name = f"prober-{uuid.uuid4().hex[:6]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": namespace},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "probe",
                        "image": image,
                        "command": ["sh", "-c", "exec sleep 600"],
                        "securityContext": {"allowPrivilegeEscalation": False},
                    }
                ],
            },
        }
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        self.cluster.kubectl(
            "-n", namespace, "wait", "--for=condition=Ready", f"pod/{self.name}", "--timeout=90s"
        )

    def reaches(self, host: str, port: int) -> bool:
        return self._run(f"nc -w 2 {host} {port} -e true")

    def resolves(self, name: str) -> bool:
        return self._run(f"nslookup {name}")

    def _run(self, probe: str) -> bool:
        script = f"if {probe} >/dev/null 2>&1; then echo OPEN; else echo BLOCKED; fi"
        done = self.cluster.run_kubectl(
            "-n", self.namespace, "exec", self.name, "--", "sh", "-c", script
        )
        assert done.stdout.strip() in ("OPEN", "BLOCKED"), done.stderr
        return done.stdout.strip() == "OPEN"

    def delete(self) -> None:
        self.cluster.kubectl("-n", self.namespace, "delete", "pod", self.name, "--wait=false")


def one_pod_kept(d, service: str) -> str:
    """Keep one pod of ``service`` (min-scale 1, a new revision) until its min-scale
    is removed and give its address: a pod scaled to zero mid-test would make every
    "cannot reach it" pass for nothing (a full run saw the check pod go before the test's
    last probe)."""
    min_scale(d.cluster, d.namespace, service, "1")
    wait_functions_serve(d.cluster, d.namespace)
    revision = d.cluster.kubectl(
        "-n",
        d.namespace,
        "get",
        "ksvc",
        service,
        "-o",
        "jsonpath={.status.latestReadyRevisionName}",
    ).strip()

    def running_pod_ip() -> str:
        return d.cluster.kubectl(
            "-n",
            d.namespace,
            "get",
            "pods",
            "-l",
            f"serving.knative.dev/revision={revision}",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].status.podIP}",
            check=False,
        ).strip()

    wait_until(running_pod_ip, f"a running pod of {revision}", 120, interval=0.5)
    return running_pod_ip().split()[0]


def test_the_shipped_network_policies_fence_task_pods_and_the_functions(
    knative_deployment, network_policies, cluster_images
):
    """With the shipped NetworkPolicies enforced (the rest of this module runs under them
    too: the Knative data plane reaches the functions, task pods the store and the relay), a
    task pod reaches neither a function, the Broker's ingress, the API server (on the node
    IP and as the kubernetes Service) nor the KIngress; a pod in another namespace reaches
    no function; a pod in Knative's own namespace does."""
    from urllib.parse import urlsplit

    from testbed.kubernetes import GATEWAY, SERVICE_IP

    d = knative_deployment
    network_policies.assert_enforcing()
    function_ip = one_pod_kept(d, "check")
    check = request_event("check", {"type": "test", "source": source()})
    assert post(d.broker, check)[0] == 202
    reply_to(d, check, "check")  # that pod answers
    broker = urlsplit(d.broker)
    s3 = urlsplit(d.s3.endpoint)
    image = cluster_images["resource"]
    other_ns = f"np-other-{uuid.uuid4().hex[:6]}"
    d.cluster.kubectl("create", "namespace", other_ns)
    wait_until(
        lambda: d.cluster.kubectl("-n", other_ns, "get", "sa", "default", check=False),
        f"the default ServiceAccount of {other_ns}",
        interval=0.5,
    )
    task = Prober(d, d.tasks_namespace, image)
    other = Prober(d, other_ns, image)
    knative = Prober(d, "knative-eventing", image)
    try:
        # What a task pod needs stays open: DNS, the store, the relay.
        assert task.resolves("reply-relay.resource-functions.svc.cluster.local")
        assert task.reaches(str(s3.hostname), int(s3.port or 80))
        assert task.reaches("reply-relay.resource-functions.svc.cluster.local", 80)
        # The data plane reaches the function: the address is live.
        assert knative.reaches(function_ip, 8080)
        closed = {
            "a function": (function_ip, 8080),
            "a function's queue-proxy": (function_ip, 8012),
            "the Broker's ingress": (str(broker.hostname), int(broker.port or 80)),
            "the API server": (GATEWAY, d.cluster.api_port),
            "the kubernetes Service": (SERVICE_IP, 443),
            "the KIngress": (GATEWAY, d.knative.kingress_port),
        }
        for what, (host, port) in closed.items():
            wait_until(lambda h=host, p=port: not task.reaches(h, p), what, interval=0.5)
        wait_until(
            lambda: not other.reaches(function_ip, 8080), "another namespace cut off", interval=0.5
        )
        assert knative.reaches(function_ip, 8080)
        assert task.reaches(str(s3.hostname), int(s3.port or 80))  # still: not just cut off
    finally:
        for prober in (task, other, knative):
            prober.delete()
        d.cluster.kubectl("delete", "namespace", other_ns, "--wait=false", check=False)
        min_scale(d.cluster, d.namespace, "check", None)


STORE_SERVICE = "rf-store"  # a name for the test S3 server on the gateway (see below)


@contextmanager
def store_by_name(d) -> Iterator[str]:
    """The task pods reach the store by a name for the duration: a selector-less Service in
    the functions' namespace with an EndpointSlice to the S3 server on the gateway, and the
    task namespace's store Secret (whose ``AWS_ENDPOINT_URL_S3`` file is what stage and
    collect use) pointing at it. Yields the name."""
    from urllib.parse import urlsplit

    from testbed.kubernetes import GATEWAY
    from tests.cluster.conftest import STORE_SECRET

    endpoint = urlsplit(d.s3.endpoint)
    port = int(endpoint.port or 80)
    host = f"{STORE_SERVICE}.{d.namespace}.svc.cluster.local"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": STORE_SERVICE, "namespace": d.namespace},
        "spec": {"ports": [{"name": "s3", "port": port, "protocol": "TCP"}]},
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{STORE_SERVICE}-gateway",
            "namespace": d.namespace,
            "labels": {
                "kubernetes.io/service-name": STORE_SERVICE,
                "endpointslice.kubernetes.io/managed-by": "rf-tests",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
        "ports": [{"name": "s3", "port": port, "protocol": "TCP"}],
    }
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, endpoints]})
    d.cluster.kubectl("apply", "-f", "-", stdin=listed)

    def secret_endpoint(url: str) -> None:
        patch = {"stringData": {"AWS_ENDPOINT_URL_S3": url}}
        d.cluster.kubectl(
            "-n", d.tasks_namespace, "patch", "secret", STORE_SECRET, "-p", json.dumps(patch)
        )

    secret_endpoint(f"http://{host}:{port}")
    try:
        yield host
    finally:
        secret_endpoint(d.s3.endpoint)
        d.cluster.kubectl("delete", "-f", "-", stdin=listed, check=False)


@contextmanager
def function_env_set(d, service: str, name: str, value: str) -> Iterator[None]:
    """``name=value`` on a function for the block (a revision each way)."""
    function_env(d, service, name, value)
    try:
        yield
    finally:
        function_env(d, service, name, None)


def function_env(d, service: str, name: str, value: str | None) -> None:
    """Set (None: remove) one env var of a function: a new revision, waited for."""
    ksvc = json.loads(d.cluster.kubectl("-n", d.namespace, "get", "ksvc", service, "-o", "json"))
    env = ksvc["spec"]["template"]["spec"]["containers"][0].get("env", [])
    kept = [e for e in env if e["name"] != name]
    kept += [] if value is None else [{"name": name, "value": value}]
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/env", "value": kept}]
    d.cluster.kubectl(
        "-n", d.namespace, "patch", "ksvc", service, "--type=json", "-p", json.dumps(patch)
    )
    wait_functions_serve(d.cluster, d.namespace)


def pod_seconds(d, event) -> float:
    """From the task pod's start to collect's end (the kubelet's timestamps, whole seconds);
    collect posts the reply before it ends, so its end is waited for."""
    from datetime import datetime

    (job,) = jobs_of(d, event)
    selector = f"job-name={job['metadata']['name']}"

    def ended() -> tuple[dict, dict] | None:
        out = d.cluster.kubectl(
            "-n", d.tasks_namespace, "get", "pods", "-l", selector, "-o", "json"
        )
        for pod in json.loads(out)["items"]:
            for step in (pod.get("status") or {}).get("containerStatuses") or []:
                if step["name"] == "collect" and "terminated" in step["state"]:
                    return pod, step
        return None

    pod, collect = wait_until(ended, f"collect's end in {selector}", 60, interval=0.5)
    start = datetime.fromisoformat(pod["status"]["startTime"])
    end = datetime.fromisoformat(collect["state"]["terminated"]["finishedAt"])
    return (end - start).total_seconds()


def pod_phase_seconds(d, event) -> float:
    """The run's ``pod`` phase as the check function measured it (its ``run finished`` line:
    from following the Job to the pod's end)."""
    got = attributes(event)
    run = run_of(KNATIVE_CACHE_SECRET, got["source"], got["id"], "check")

    def find() -> float | None:
        for text in function_logs(d, "check").splitlines():
            _, _, body = text.partition("] ")
            if run in body and body.startswith("{"):
                line = json.loads(body)
                if line.get("message") == "run finished" and line.get("run_id") == run:
                    return float(line["phases"]["pod"])
        return None

    return wait_until(find, f"the run finished line of {run}", 60, interval=0.5)


def checked(d, **extra: object):
    """An async check of a fresh source, posted; the request event."""
    check = request_event("check", {"type": "test", "source": source(**extra)}, replymode="async")
    assert post(d.broker, check)[0] == 202
    return check


def test_collect_reaches_the_store_and_the_relay_whatever_the_resource_did_to_name_files(
    knative_deployment, capsys
):
    """The resource step runs as root and rewrites the pod's /etc/hosts (the store's and the
    reply relay's names to 127.0.0.1) and /etc/resolv.conf (a bogus name server first, or the
    only one), files mounted into every container of the pod. With the shipped
    ``TASK_NAME_FILES=auto`` (the functions run in the cluster) collect resolves with
    read-only copies of the function's own files: the reply arrives through the relay and the
    result is stored. With ``TASK_NAME_FILES=off`` set on the check function (a new revision)
    the check whose resource left only the bogus name server fails: collect cannot reach the
    store (with a name server of its own on a public address, which task pods may reach, a
    resource would send collect to a server of its choosing). Measured here too, unpinned:
    the /etc/hosts lines and a bogus name server put first do not reach collect (the kubelet
    writes the pod's /etc/hosts afresh as it starts each container, and the resolver falls
    through to the next name server).

    The harness's store is an IP address (the S3 server on the gateway), which no name file
    can redirect; so for this test the task pods reach it by a Service name
    (``store_by_name``), as an in-cluster store would be reached. Also printed: a plain
    check's task pod, from its start to collect's end, pinned and not (no container is added;
    whole seconds, three runs each). Its checks run as Jobs (``WARM_CHECKS=off`` on the
    check function: a warm check has no collect step, its function collects it)."""
    from functions import keys
    from functions.ledger import results

    d = knative_deployment
    relay = f"reply-relay.{d.namespace}.svc.cluster.local"
    seconds: dict[str, list[float]] = {}
    phases: dict[str, list[float]] = {}
    with function_env_set(d, "check", "WARM_CHECKS", "off"), store_by_name(d) as store:
        names = f"{store} {relay}"
        seconds["pinned"], phases["pinned"] = [], []
        for _ in range(3):
            plain = checked(d)
            assert_reply(reply_to(d, plain, "check"), plain, "check")
            seconds["pinned"].append(pod_seconds(d, plain))
            phases["pinned"].append(round(pod_phase_seconds(d, plain), 3))
        check = checked(d, mode="hijack_names", names=names, resolv="only")
        reply = reply_to(d, check, "check")
        assert assert_reply(reply, check, "check")["versions"][-1] == {"ref": "3"}
        relayed = d.cluster.kubectl(
            "-n", d.namespace, "logs", "-l", "app.kubernetes.io/component=reply-relay", "--tail=-1"
        )
        assert reply.get_id() in relayed  # collect posted it, through the relay
        got = attributes(check)
        run = run_of(KNATIVE_CACHE_SECRET, got["source"], got["id"], "check")
        assert results.read_outcome(d.store, run, request=None) is not None
        with d.store.open(keys.log_key(run)) as stream:
            assert f"hijacked: {names} (resolv: only)" in stream.read().decode()
        (job,) = jobs_of(d, check)
        assert pinned_paths(job) == {
            "collect": {"/etc/hosts", "/etc/resolv.conf"},
            "resource": set(),
        }

        with function_env_set(d, "check", "TASK_NAME_FILES", "off"):
            seconds["not pinned"], phases["not pinned"] = [], []
            for _ in range(3):
                plain = checked(d)
                assert_reply(reply_to(d, plain, "check"), plain, "check")
                seconds["not pinned"].append(pod_seconds(d, plain))
                phases["not pinned"].append(round(pod_phase_seconds(d, plain), 3))
            first = checked(d, mode="hijack_names", names=names, resolv="first")
            assert_reply(reply_to(d, first, "check"), first, "check")  # see the docstring
            (job,) = jobs_of(d, first)
            assert pinned_paths(job) == {"collect": set(), "resource": set()}  # the off revision
            check = checked(d, mode="hijack_names", names=names, resolv="only")
            data = assert_reply(reply_to(d, check, "check"), check, "check", "failed")
            assert data["error"]["kind"] == "storage", data
    with capsys.disabled():
        print(
            f"\n[knative] task pod, start to collect's end (kubelet, s): {seconds}; "
            f"the run's pod phase (the function, s): {phases}"
        )


def pinned_paths(job: dict) -> dict[str, set[str]]:
    """Which of /etc/hosts and /etc/resolv.conf collect and resource mount (read-only, from
    the name-files volume: anything else fails here)."""
    spec = job["spec"]["template"]["spec"]
    steps = {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}
    found: dict[str, set[str]] = {}
    for name in ("collect", "resource"):
        mounts = [
            m
            for m in steps[name].get("volumeMounts", [])
            if m["mountPath"] in ("/etc/hosts", "/etc/resolv.conf")
        ]
        assert all(m["readOnly"] is True and m["name"] == "name-files" for m in mounts), mounts
        found[name] = {m["mountPath"] for m in mounts}
    return found


# --- what waits on the shipped Broker's retries: started with the module, checked at its end --


@pytest.fixture(scope="module", autouse=True)
def broker_waits(knative_deployment) -> Iterator[dict[str, Future]]:
    """The two scenarios that wait on the shipped Broker's retries (about two minutes and
    one) start with the module, in threads, so that its other tests run meanwhile (none of
    them touches what these use: their own Triggers, event types and subscribers); the two
    tests at the module's end take their results."""
    with ThreadPoolExecutor(2) as pool:
        yield {
            "dead letter": pool.submit(dead_letter_scenario, knative_deployment),
            "429": pool.submit(busy_scenario, knative_deployment),
        }


def dead_letter_scenario(d) -> None:
    """An event no subscriber can take: after the shipped Broker's retries (about two
    minutes), the dead-letter service logs it once."""
    from functions.cli.launch import free_port
    from testbed.kubernetes import GATEWAY

    kind = "dev.resourcefunctions.test.undeliverable"
    address = f"{GATEWAY}:{free_port(GATEWAY)}"  # nothing listens there
    trigger = typed_trigger("undeliverable", d.namespace, kind, f"http://{address}/")
    d.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(trigger))
    try:
        d.cluster.kubectl(
            "-n",
            d.namespace,
            "wait",
            "--for=condition=Ready",
            "trigger/undeliverable",
            "--timeout=60s",
        )
        # Once in a full run the channel fanned an event out without the Trigger just made
        # Ready (its filter never saw it). The POST returns when the channel is done with the
        # event (retries and dead-lettering included), so an event the filter tried to send
        # on is the one to follow; another is sent if it did not.
        for _ in range(3):
            event = typed_event(kind, "undeliverable")
            event_id = event.get_id()
            tried = knative_log(d, FILTER).count(address)
            assert post(d.broker, event)[0] == 202
            if knative_log(d, FILTER).count(address) > tried:
                break
        else:
            raise AssertionError("the Broker's filter never tried the new Trigger's subscriber")
        logs = wait_until(
            lambda: event_id in (text := function_logs(d, "dead-letter")) and text,
            "dead-lettered",
            150,
            interval=0.5,
        )
        lines = [line for line in logs.splitlines() if event_id in line]
        assert "undeliverable event" in lines[0] and kind in lines[0]
        time.sleep(5)  # a rejected answer would bring it again within seconds (2 s backoff)
        again = [line for line in function_logs(d, "dead-letter").splitlines() if event_id in line]
        assert len(again) == 1, again  # the sink's answer was taken: delivered once
    finally:
        d.cluster.kubectl("-n", d.namespace, "delete", "trigger", "undeliverable", check=False)


BUSY_SECONDS = 40  # longer than the 31 s of retries the Broker shipped before (5 from PT1S)


def busy_scenario(d) -> tuple[list[float], int, int]:
    """A stand-in for a function whose team is at its ``MAX_RUNS_PER_TEAM``: a sink that
    answers 429 with the functions' ``Retry-After`` for ``BUSY_SECONDS`` after the first
    attempt, then takes the event. Its Trigger sets no delivery of its own, so the shipped
    Broker's retries carry the event past the busy time to it, and it is not dead-lettered.
    The attempts' offsets, the producer's status and how many deliveries the sink took."""
    from functions.service.teams import RETRY_AFTER_SECONDS

    kind = "dev.resourcefunctions.test.busy"
    with sinks.event_sink(GATEWAY) as busy:
        busy.status, busy.retry_after = 429, str(RETRY_AFTER_SECONDS)
        trigger = typed_trigger("busy", d.namespace, kind, busy.url)
        d.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(trigger))
        try:
            wait_ready(d.cluster, d.namespace, ["trigger/busy"])
            # As in the dead-letter test: a Trigger just made Ready may miss the first event.
            for _ in range(3):
                event = typed_event(kind, "busy")
                sent = parallel_post(d.broker, event)
                try:
                    wait_until(lambda: busy.attempts, "the first attempt", 15, interval=0.2)
                    break
                except NotReady:
                    continue
            else:
                raise AssertionError("the Broker's filter never tried the new Trigger")
            first = busy.attempts[0]
            time.sleep(max(0.0, first + BUSY_SECONDS - time.monotonic()))
            busy.status = 202  # the team's runs have ended
            taken = busy.wait(timeout=150, id=event.get_id())
            status, _ = sent.result(timeout=60)
        finally:
            d.cluster.kubectl("-n", d.namespace, "delete", "trigger", "busy", check=False)

    return [round(at - first, 1) for at in busy.attempts], status, len(taken)


def test_an_undeliverable_event_reaches_the_dead_letter_service(broker_waits):
    broker_waits["dead letter"].result(timeout=600)


def test_a_request_answered_429_is_retried_until_its_team_has_room(broker_waits, capsys):
    """The attempts' times are printed: Knative 1.22 does not wait for ``Retry-After`` unless
    its alpha ``delivery-retryafter`` is on (docs/deployment.md)."""
    from functions.service.teams import RETRY_AFTER_SECONDS

    offsets, status, taken = broker_waits["429"].result(timeout=600)
    with capsys.disabled():
        print(f"\n[knative] a 429 (Retry-After {RETRY_AFTER_SECONDS}) retried at {offsets} s")
    assert status == 202
    assert taken == 1
    assert offsets[-1] >= BUSY_SECONDS and len(offsets) >= 2, offsets
