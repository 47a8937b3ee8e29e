"""Load simulation: one check across replicas. N check-service replicas (real gunicorn
processes, ``bench/check_replica.py``: the real service with an in-process runtime stand-in
and a store wrapper that counts requests) share one store; checks arrive at 1,000 per minute
over 200 distinct resources.

Every resource ticks once per interval (60 s, ticks spread evenly over it); a tick is
``--copies`` identical checks (``"version": "latest-known"``, distinct event ids) sent within
``--jitter`` seconds, copy j to replica j mod N: as if each replica's own scheduler fired it.
200 resources x 5 copies per minute = 1,000 checks per minute. Each configuration runs twice
on the same store kind, with the lease (``CHECK_LEASE_SECONDS=30``) and without it
(``CHECK_LEASE_SECONDS=0``: the in-process single flight alone, the baseline), and reports

    runs per resource-interval   runs started / (resource, interval) pairs that ticked;
                                 the goal is 1.0 at 5 replicas
    store requests per check     every Store call made by the replicas / checks answered

on a file store and on versitygw (a real S3 server, started here on loopback). ``--seconds``
shortens the run (the rate stays 1,000 per minute; fewer resources tick).

``--reply async`` (or ``sync,async``) sets ``REPLY_MODE=async`` with ``K_SINK`` an event sink
on loopback here: the lease holder's check starts its task (202; the task records, releases
the lease and posts the reply to the sink), identical checks wait and answer 200. It also
reports the answers: 200 and 202 per check, and whether each check got exactly one (a 200,
or a reply event at the sink for a 202: ``unanswered`` and ``twice`` count the exceptions).

    python bench/check_load.py --seconds 20                 # quick: a third of an interval
    python bench/check_load.py --seconds 120 --replicas 5   # two full intervals
    python bench/check_load.py --seconds 60 --reply async   # the shipped reply mode
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from functions.cli.launch import alive, free_port, serving, wait_until
from functions.replies import DISCOVERED_TYPE as DISCOVERED
from testbed.event_sink import EventSink, event_sink

BUCKET = "bench-checks"
IMAGE = "example.org/bench-resource@sha256:" + "c" * 64


@dataclass(frozen=True)
class Load:
    replicas: int
    resources: int
    copies: int
    interval: float
    seconds: float
    jitter: float
    run_seconds: float


@dataclass(frozen=True)
class Answers:
    """How the checks were answered: HTTP statuses (0: no response) and, for async replies,
    the reply events the sink received."""

    statuses: Counter[int]
    replies: int = 0  # reply events at the sink (not version.discovered)
    unanswered: int = 0  # 202 without a reply event
    twice: int = 0  # a reply event on top of a 200, or more than one reply event

    @property
    def other(self) -> int:
        """Neither 200 nor 202: non-2xx and no response."""
        return sum(n for status, n in self.statuses.items() if status not in (200, 202))


@dataclass(frozen=True)
class Result:
    store: str
    reply: str
    lease: bool
    checks: int
    answers: Answers
    ticks: int  # (resource, interval) pairs that ticked
    runs: int
    starts: int  # tasks the replicas were asked to start (async)
    store_requests: Counter[str]

    @property
    def runs_per_tick(self) -> float:
        return self.runs / self.ticks

    @property
    def requests_per_check(self) -> float:
        return sum(self.store_requests.values()) / self.checks


@contextmanager
def replicas(env: dict[str, str], count: int, log: Path) -> Iterator[list[str]]:
    """``count`` replica processes on ``env``'s store; their URLs once all are healthy."""
    procs, urls = [], []
    with open(log, "ab") as out:
        for _ in range(count):
            port = free_port()
            command = [sys.executable, str(REPO / "bench/check_replica.py"), "--port", str(port)]
            procs.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=out))
            urls.append(f"http://127.0.0.1:{port}")
    try:
        for url, proc in zip(urls, procs, strict=True):
            wait_until(
                partial(serving, url),
                f"replica {url} (log: {log})",
                60,
                alive=partial(alive, proc),
            )
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def schedule(load: Load, rng: random.Random) -> list[tuple[float, int, int]]:
    """(send time, resource, replica) of every check, in time order."""
    sends = []
    step = load.interval / load.resources
    for tick in range(int(load.seconds / step + 0.999)):
        at, resource = tick * step, tick % load.resources
        for copy in range(load.copies):
            sends.append((at + rng.uniform(0, load.jitter), resource, copy % load.replicas))
    return sorted(sends)


def check_event(resource: int) -> tuple[dict[str, str], bytes]:
    """A binary-mode check request for ``resource`` with a fresh event id."""
    headers = {
        "ce-specversion": "1.0",
        "ce-type": "dev.resourcefunctions.check.requested",
        "ce-source": "/bench/check-load",
        "ce-id": uuid.uuid4().hex,
        "content-type": "application/json",
    }
    data = {
        "type": "bench",
        "source": {"uri": f"https://example.org/repo-{resource}.git"},
        "version": "latest-known",
    }
    return headers, json.dumps(data).encode()


def drive(urls: list[str], load: Load, seed: int) -> tuple[dict[str, int], int]:
    """Send the schedule; (HTTP status by event id, resource-intervals that ticked)."""
    sends = schedule(load, random.Random(seed))
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    local = threading.local()

    def send(resource: int, replica: int) -> None:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        headers, body = check_event(resource)
        try:
            # A wait past this (an async waiter's may last the holder's task budget) is
            # counted as no answer: "other".
            status = session.post(urls[replica], headers=headers, data=body, timeout=120)
            code = status.status_code
        except requests.RequestException:
            code = 0
        with lock:
            statuses[headers["ce-id"]] = code

    start = time.monotonic()
    with ThreadPoolExecutor(128) as pool:
        for at, resource, replica in sends:
            time.sleep(max(0.0, start + at - time.monotonic()))
            pool.submit(send, resource, replica)
    ticks = len({(int(at // load.interval), r) for at, r, _ in sends})
    return statuses, ticks


def answers(statuses: dict[str, int], sink: EventSink | None, wait: float) -> Answers:
    """Match the 202s to the reply events at ``sink``, waiting up to ``wait`` seconds for
    the tasks still running to post theirs."""
    if sink is None:
        return Answers(Counter(statuses.values()))
    replied: Counter[str] = Counter()
    accepted = {event_id for event_id, status in statuses.items() if status == 202}
    deadline = time.monotonic() + wait
    while True:
        for event in sink.drain():
            if event.get_type() != DISCOVERED:
                replied[str(event.get_extension("requestid"))] += 1
        if accepted <= set(replied) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Answered more than once: a reply event on top of a 200, or several reply events.
    twice = sum(1 for event_id, n in replied.items() if n + (statuses.get(event_id) == 200) > 1)
    return Answers(
        Counter(statuses.values()),
        replies=sum(replied.values()),
        unanswered=len(accepted - set(replied)),
        twice=twice,
    )


def measure(
    store: str, base_env: dict[str, str], load: Load, reply: str, lease: bool, work: Path
) -> Result:
    with ExitStack() as stack:
        sink = stack.enter_context(event_sink()) if reply == "async" else None
        env = replica_env(base_env, load, reply, lease, sink)
        urls = stack.enter_context(replicas(env, load.replicas, work / f"replicas-{store}.log"))
        statuses, ticks = drive(urls, load, seed=1)
        answered = answers(statuses, sink, wait=60)
        counts = [requests.get(url + "/bench/counts", timeout=10).json() for url in urls]
    store_requests: Counter[str] = Counter()
    for count in counts:
        store_requests.update(count["store"])
    runs = sum(count["runs"] for count in counts)
    starts = sum(count["starts"] for count in counts)
    return Result(store, reply, lease, len(statuses), answered, ticks, runs, starts, store_requests)


def replica_env(
    base_env: dict[str, str], load: Load, reply: str, lease: bool, sink: EventSink | None
) -> dict[str, str]:
    """The replicas' environment: a store prefix of their own per configuration."""
    env = {
        **base_env,
        "STORE_URL": f"{base_env['STORE_URL']}/{reply}-{'lease' if lease else 'baseline'}",
        "REPLY_MODE": reply,
        "CHECK_LEASE_SECONDS": "30" if lease else "0",
        "CACHE_SECRET": "bench-check-load",
        "RESOURCE_TYPES": json.dumps({"bench": IMAGE}),
        "LOG_LEVEL": "warning",
        "THREADS": "64",
        "BENCH_RUN_SECONDS": str(load.run_seconds),
        "PYTHONPATH": str(REPO),
    }
    if sink is not None:
        env["K_SINK"] = sink.url
    return env


@contextmanager
def store_env(kind: str, work: Path) -> Iterator[dict[str, str]]:
    """The environment of replicas sharing a store of ``kind`` (each run adds its prefix)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("K_", "AWS_"))}
    if kind == "file":
        (work / "store").mkdir(exist_ok=True)
        yield {**env, "STORE_URL": (work / "store" / uuid.uuid4().hex).as_uri()}
        return
    from testbed.versitygw import start_versitygw

    with start_versitygw(root=work / "versitygw", log=work / "versitygw.log") as server:
        server.client().create_bucket(Bucket=BUCKET)
        s3_env = {k: v for k, v in server.env().items() if v is not None}
        yield {**env, **s3_env, "STORE_URL": f"s3://{BUCKET}/{uuid.uuid4().hex}"}


def report(results: list[Result], load: Load) -> None:
    rate = load.resources * load.copies * 60 / load.interval
    print(
        f"\n{load.replicas} replicas, {load.resources} resources, {load.copies} copies per "
        f"tick, {rate:.0f} checks/min, {load.seconds:.0f} s, run {load.run_seconds} s"
    )
    print(
        f"{'store':6} {'reply':6} {'lease':5} {'checks':>6} {'200':>5} {'202':>5} {'other':>5} "
        f"{'sink':>5} {'unanswered':>10} {'twice':>5} {'runs':>5} {'runs/res-interval':>17} "
        f"{'store req/check':>15}  requests by kind"
    )
    for r in results:
        a = r.answers
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.store_requests.items()))
        print(
            f"{r.store:6} {r.reply:6} {'on' if r.lease else 'off':5} {r.checks:6} "
            f"{a.statuses[200]:5} {a.statuses[202]:5} {a.other:5} {a.replies:5} "
            f"{a.unanswered:10} {a.twice:5} {r.runs:5} {r.runs_per_tick:17.2f} "
            f"{r.requests_per_check:15.2f}  {kinds}"
        )
    for store, reply in dict.fromkeys((r.store, r.reply) for r in results):
        on = next(r for r in results if (r.store, r.reply, r.lease) == (store, reply, True))
        off = next(r for r in results if (r.store, r.reply, r.lease) == (store, reply, False))
        print(
            f"{store} {reply}: lease/baseline runs {on.runs_per_tick / off.runs_per_tick:.2f}, "
            f"store requests per check {on.requests_per_check / off.requests_per_check:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=5)
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--copies", type=int, default=5, help="identical checks per tick")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between ticks")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each run")
    parser.add_argument("--jitter", type=float, default=0.2, help="spread of a tick's copies")
    parser.add_argument("--run-seconds", type=float, default=0.5, help="a check's run time")
    parser.add_argument("--stores", default="file,s3", help="file and/or s3 (versitygw)")
    parser.add_argument("--reply", default="sync", help="sync and/or async (REPLY_MODE)")
    args = parser.parse_args()
    load = Load(
        args.replicas,
        args.resources,
        args.copies,
        args.interval,
        args.seconds,
        args.jitter,
        args.run_seconds,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="check-load-") as tmp:
        for kind in args.stores.split(","):
            with store_env(kind, Path(tmp)) as env:
                for reply in args.reply.split(","):
                    for lease in (False, True):
                        results.append(measure(kind, env, load, reply, lease, Path(tmp)))
                        print(results[-1], flush=True)
    report(results, load)


if __name__ == "__main__":
    main()
