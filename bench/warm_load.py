"""Warm check containers under load (issue 30, docs/warm-checks.md): many resources, each
checked on a schedule through the check service on Podman, two ways in one run, same load:

    warm            WARM_CHECKS=on: each check an exec in its resource's warm container
    new container   WARM_CHECKS=off: a new container per check, as before (the baseline)

The load: ``--resources`` (50) resources, distinct ``source``s of one type, each checked every
``--interval`` (10) seconds for ``--seconds`` (300), the resources' ticks spread evenly over
the interval (an open loop: a check is sent at its time whether or not the last one was
answered). Each check is a binary-mode CloudEvent with a synchronous reply. ``--clients K``
measures capacity instead: K clients, each checking its share of the resources one after
another as fast as they are answered (a closed loop).

The resource: a busybox image built here (``functions.cli.busybox_image``) whose check counts
the checks run in its container in ``$TMPDIR`` and answers that count as its version, so the
replies show the state a warm container keeps (the new-container way always answers 1). No
network: its containers run on ``--network`` (``none``).

The service is the project's launcher against a Podman API service of its own, started at log
level info, whose access log lines count the engine API requests (every request of the
service during the load, its sweeps included). The caps an operator raises for this many
resources are raised (printed): MAX_RUNS_PER_TEAM (8 by default: a 429 above it), the warm
caps WARM_CHECKS_PER_TEAM (16) and WARM_CHECKS_PER_REPLICA (64), THREADS (16).

Prints per way: checks answered per minute (and the offered rate), failures by kind, latency
p50/p95/p99 and p95/p50 (from each check's due time: a late send counts), engine API requests
per check (by request), the runs' mean phases and the store calls over 1 s (the service's
metrics), the share of the time some task of the machine waited for CPU and for IO
(/proc/pressure: the machine is shared), and for the warm way the warm containers' count and
memory at the end of the load: their cgroups' usage, and their conmon processes' (PSS), one per
container plus the two Podman keeps for each exec session for ``exit_command_delay`` after it
ends (containers.conf, 300 s by default; ``--exit-command-delay`` sets it for the bench's
Podman service). Then warm / new container for checks per minute and latency. ``--keep``
keeps the service and engine logs.

    python3 bench/warm_load.py                                  # 50 resources, 5 min per way
    python3 bench/warm_load.py --resources 10 --seconds 30      # quick
    python3 bench/warm_load.py --clients 16 --seconds 60        # capacity, closed loop
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from functions.cli.busybox_image import build_resource_image
from functions.cli.launch import Launched, launch
from functions.cli.send import request_event
from functions.events import to_http
from testbed.podman import podman_service

IMAGE_NAME = "localhost/rf-bench-warm-load"
CHECK_SCRIPT = """#!/bin/sh
# A check that remembers: the checks run in this container, counted in $TMPDIR.
cat > /dev/null
dir=${TMPDIR:-/tmp}
count=$(( $(cat "$dir/checks" 2>/dev/null || echo 0) + 1 ))
echo "$count" > "$dir/checks"
echo "[{\\"checks\\":\\"$count\\"}]"
"""
WAYS = {"on": "warm", "off": "new container"}
CLIENT_THREADS = 256  # checks in flight at most on the schedule; more wait for a thread
ANSWER_TIMEOUT = 120  # seconds: a check not answered by then counts as "no answer"
# An engine request line in Podman's access log: "GET /v1.41/containers/json?all=1 HTTP/1.1" 200
ACCESS = re.compile(r'"([A-Z]+) (/\S*) HTTP/[\d.]+" (\d{3})')
IDS = (  # request paths with their ids and names out, so that requests group by kind
    (re.compile(r"^/v[\d.]+"), ""),
    (re.compile(r"^/libpod"), "/libpod"),
    (re.compile(r"\?.*"), ""),
    (re.compile(r"^(/libpod)?/(containers|exec)/(?!create$|json$)[^/]+"), r"\1/\2/{id}"),
    (re.compile(r"^(/libpod)?/images/.+/json$"), r"\1/images/{name}/json"),
)


@dataclass(frozen=True)
class Load:
    resources: int
    interval: float
    seconds: float
    clients: int  # 0: the schedule (open loop); else a closed loop of this many clients

    @property
    def offered_per_minute(self) -> float:
        return self.resources * 60 / self.interval


@dataclass(frozen=True)
class Check:
    resource: int
    started: float  # monotonic
    took: float
    outcome: str  # ok, failed (a .failed reply), 429, 5xx, other HTTP, no answer
    count: int = 0  # the checks its container had run, this one included (ok only)


@dataclass(frozen=True)
class Result:
    way: str
    checks: list[Check]
    seconds: float  # first send to last answer
    engine: Counter[str]  # engine API requests during the load, by kind
    service: Service
    stalled: dict[str, float]  # share of the load's time some task waited: cpu, io
    memory: WarmMemory | None  # the warm containers' memory at the end of the load

    def ok(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "ok"]

    def per_minute(self) -> float:
        return len(self.ok()) * 60 / self.seconds

    def runs_per_minute(self) -> float:
        return self.service.runs * 60 / self.seconds


# --- the load ---------------------------------------------------------------------------------


def schedule(load: Load) -> list[tuple[float, int]]:
    """(send time, resource) of every check, in time order: resource r at r/N of the interval,
    then every interval, while within ``load.seconds``."""
    sends = []
    for tick in range(math.ceil(load.seconds / load.interval)):
        for r in range(load.resources):
            at = (tick + r / load.resources) * load.interval
            if at < load.seconds:
                sends.append((at, r))
    return sends


def check_event(resource: int) -> tuple[dict[str, str], bytes]:
    data = {"type": "load", "source": {"uri": f"https://example.org/repo-{resource}.git"}}
    return to_http(request_event("check", data, source="/bench/warm-load"))


def outcome(answer: requests.Response) -> tuple[str, int]:
    """The check's outcome and, if it succeeded, the count its container answered."""
    if answer.status_code == 200 and answer.headers.get("ce-type", "").endswith(".succeeded"):
        return "ok", int(answer.json()["versions"][-1]["checks"])
    if answer.status_code == 200:
        return "failed", 0
    if answer.status_code == 429:
        return "429", 0
    return ("5xx" if answer.status_code >= 500 else f"HTTP {answer.status_code}"), 0


class Sender:
    """Posts checks to ``url``, a keep-alive session per thread, and keeps every result."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.checks: list[Check] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def send(self, resource: int, due: float | None = None) -> None:
        """One check of ``resource``, timed from ``due`` (when it was meant to be sent: a
        check that waited for a free client thread waited as a user's would) or from now."""
        session = getattr(self._local, "session", None) or requests.Session()
        self._local.session = session
        headers, body = check_event(resource)
        started = time.monotonic() if due is None else due
        try:
            answer = session.post(self.url, headers=headers, data=body, timeout=ANSWER_TIMEOUT)
            kind, count = outcome(answer)
        except requests.RequestException:
            kind, count = "no answer", 0
        check = Check(resource, started, time.monotonic() - started, kind, count)
        with self._lock:
            self.checks.append(check)


def on_schedule(sender: Sender, load: Load) -> None:
    """Send each check at its time (an open loop), answered or not."""
    start = time.monotonic()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        for at, resource in schedule(load):
            time.sleep(max(0.0, start + at - time.monotonic()))
            pool.submit(sender.send, resource, start + at)


def flat_out(sender: Sender, load: Load) -> None:
    """``load.clients`` clients, client c checking resources c, c+K, ... in turn, each check
    sent when the last is answered, until ``load.seconds`` have passed (a closed loop)."""
    end = time.monotonic() + load.seconds

    def client(c: int) -> None:
        mine = list(range(c, load.resources, load.clients))
        n = 0
        while time.monotonic() < end:
            sender.send(mine[n % len(mine)])
            n += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(load.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# --- what the engine saw ----------------------------------------------------------------------


def engine_requests(log: Path, start: int, end: int) -> Counter[str]:
    """The API requests in ``log``'s bytes [start, end) by kind: "METHOD /path" without ids."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(end - start).decode(errors="replace")
    kinds: Counter[str] = Counter()
    for method, path, _status in ACCESS.findall(text):
        for pattern, replacement in IDS:
            path = pattern.sub(replacement, path)
        kinds[f"{method} {path}"] += 1
    return kinds


def containers(image: str, *labels: str) -> list[str]:
    """Ids of the containers (any state) of ``image`` with every label in ``labels`` (the
    podman CLI: not through the API service, so not counted)."""
    filters = [f"--filter=ancestor={image}", *(f"--filter=label={label}" for label in labels)]
    listed = subprocess.run(
        ["podman", "ps", "-a", "-q", "--no-trunc", *filters],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def cgroup_memory(container: str) -> int | None:
    """The bytes charged to ``container``'s memory cgroup (v1 or v2); None if unreadable."""
    path = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.CgroupPath}}", container],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    for file in (f"memory{path}/memory.usage_in_bytes", f"{path.lstrip('/')}/memory.current"):
        try:
            return int((Path("/sys/fs/cgroup") / file).read_text())
        except (OSError, ValueError):
            continue
    return None


@dataclass(frozen=True)
class WarmMemory:
    containers: int
    cgroups: int | None  # bytes charged to their memory cgroups (None: a cgroup unread)
    conmons: int  # conmon processes: one per container
    exec_conmons: int  # and one per exec session Podman still keeps
    conmon_pss: int  # bytes, proportional set size of all those conmons


def warm_memory(image: str) -> WarmMemory:
    """The warm check containers of ``image`` and what they take in memory now."""
    ids = containers(image, "warm-check")
    sizes = [cgroup_memory(c) for c in ids]
    cgroups = None if None in sizes else sum(size or 0 for size in sizes)
    return WarmMemory(len(ids), cgroups, *conmons(set(ids)))


def conmons(container_ids: set[str]) -> tuple[int, int, int]:
    """Podman's conmon processes of these containers: (one per container, one per exec
    session still kept, their memory: proportional set size in bytes). Podman keeps an API
    exec session's conmon for ``exit_command_delay`` (containers.conf, 300 s by default)
    after the exec ends, so that its exit code can be asked for."""
    mains, execs, pss = 0, 0, 0
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            if not args[0].endswith(b"conmon") or b"-c" not in args:
                continue
            if args[args.index(b"-c") + 1].decode() not in container_ids:
                continue
            rollup = (proc / "smaps_rollup").read_text()
        except (OSError, IndexError):
            continue
        execs, mains = (execs + 1, mains) if b"--exec-attach" in args else (execs, mains + 1)
        pss += sum(
            int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")
        )
    return mains, execs, pss


@dataclass(frozen=True)
class Service:
    """What the check service's metrics said at the end of the load."""

    warm: dict[str, float]  # warm counters: starts, reuses, alive, evictions by reason
    phases: dict[str, float]  # mean seconds of each phase of its runs
    store_calls: int
    store_slow: int  # store calls over 1 s
    runs: int  # checks run (a container or an exec each)
    joined: int  # checks answered by another's run (the lease: one run of a resource at once)


def service_metrics(url: str) -> Service:
    text = requests.get(url + "/metrics", timeout=10).text
    warm: dict[str, float] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    calls = fast = runs = joined = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name.startswith("resource_function_warm_"):
                reason = labels.get("reason")
                name = name.removeprefix("resource_function_warm_")
                warm[f"{name}{{{reason}}}" if reason else name] = sample.value
            elif name == "resource_function_run_phase_seconds_sum":
                sums[labels["phase"]] = sample.value
            elif name == "resource_function_run_phase_seconds_count":
                counts[labels["phase"]] = sample.value
            elif name == "resource_function_runs_total":
                runs += sample.value
            elif name == "resource_function_joined_runs_total":
                joined += sample.value
            elif name == "resource_function_store_seconds_bucket" and labels["le"] == "+Inf":
                calls += sample.value
            elif name == "resource_function_store_seconds_bucket" and labels["le"] == "1.0":
                fast += sample.value
    phases = {phase: sums[phase] / n for phase, n in counts.items() if n}
    return Service(warm, phases, int(calls), int(calls - fast), int(runs), int(joined))


def pressure() -> dict[str, int]:
    """Microseconds some task of this machine waited for CPU, and for IO, so far (Linux's
    pressure stall information; empty where the kernel has none)."""
    totals = {}
    for kind in ("cpu", "io"):
        try:
            some = Path(f"/proc/pressure/{kind}").read_text().splitlines()[0]
        except OSError:
            continue
        totals[kind] = int(some.rsplit("total=", 1)[1])
    return totals


def settle(predicate: Callable[[], bool], seconds: float) -> None:
    """Wait up to ``seconds`` for ``predicate``."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


# --- one way ----------------------------------------------------------------------------------


def service_env(
    tmp: Path, docker_host: str, image: str, warm: str, load: Load, network: str
) -> dict[str, str]:
    """The check service's environment: reuse ``warm`` (on/off), the caps raised for the
    load, the resource containers on ``network``."""
    store = tmp / f"store-{warm}"
    store.mkdir()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("K_")},
        **caps(load),
        "RUNTIME": "container",
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps({"load": image}),
        "CACHE_SECRET": "bench-warm-load",
        "STORE_URL": store.as_uri(),
        "WORK_DIR": str(tmp),
        "CONTAINER_NETWORK": network,
        "WARM_CHECKS": warm,
    }


def caps(load: Load) -> dict[str, str]:
    """What an operator raises for this many resources (the defaults: 8 runs in flight per
    team, 16 warm containers per team, 64 per replica, 16 threads)."""
    threads = max(64, 2 * load.clients)
    return {
        "THREADS": str(threads),
        "MAX_RUNS_PER_TEAM": str(threads),
        "WARM_CHECKS_PER_TEAM": str(max(16, load.resources)),
        "WARM_CHECKS_PER_REPLICA": str(max(64, load.resources)),
    }


def engine_env(tmp: Path, exit_delay: int | None) -> dict[str, str] | None:
    """The Podman service's environment: this process's (None), or with ``exit_delay`` a
    copy of this machine's containers.conf whose [engine] sets ``exit_command_delay``."""
    if exit_delay is None:
        return None
    conf = Path(os.environ.get("CONTAINERS_CONF", "/etc/containers/containers.conf"))
    text = conf.read_text() if conf.is_file() else ""
    line = f"exit_command_delay = {exit_delay}"
    engine = re.compile(r"^\[engine\][^\n]*\n", re.MULTILINE)
    text, found = engine.subn(lambda m: f"{m.group(0)}{line}\n", text, count=1)
    if not found:
        text += f"\n[engine]\n{line}\n"
    (tmp / "containers.conf").write_text(text)
    return {**os.environ, "CONTAINERS_CONF": str(tmp / "containers.conf")}


@contextmanager
def check_service(env: dict[str, str], log: Path) -> Iterator[Launched]:
    with log.open("ab") as out:
        launched = launch(env, actions=("check",), output=out)
    try:
        launched.wait_serving(60)
        yield launched
    finally:
        launched.stop()


def measure(way: str, env: dict[str, str], load: Load, image: str, tmp: Path) -> Result:
    """Run the load through a check service of ``env``; what it answered and cost."""
    engine_log = tmp / "podman.log"
    with check_service(env, tmp / f"service-{way}.log") as launched:
        url = launched.urls["check"]
        sender = Sender(url)
        start = engine_log.stat().st_size
        began, before = time.monotonic(), pressure()
        (flat_out if load.clients else on_schedule)(sender, load)
        seconds, after = max(c.started + c.took for c in sender.checks) - began, pressure()
        warm = env["WARM_CHECKS"] == "on"
        memory = warm_memory(image) if warm else None
        if not warm:  # new containers are removed after their replies: count that too
            settle(lambda: not containers(image), 120)
        time.sleep(1)  # the engine writes a request's line once it is done
        engine = engine_requests(engine_log, start, engine_log.stat().st_size)
        service = service_metrics(url)
    stalled = {k: (after[k] - before[k]) / (seconds * 1e6) for k in before.keys() & after.keys()}
    return Result(way, sender.checks, seconds, engine, service, stalled, memory)


# --- the report -------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": cuts[94], "p99": cuts[98]}


def report_way(r: Result, load: Load) -> None:
    ok = r.ok()
    failures = Counter(c.outcome for c in r.checks if c.outcome != "ok")
    offered = "" if load.clients else f" (offered {load.offered_per_minute:.0f})"
    print(f"\n== {r.way}: {len(r.checks)} checks sent, {len(ok)} answered ok in {r.seconds:.1f} s")
    print(f"   checks answered ok per minute: {r.per_minute():.1f}{offered}")
    if r.seconds >= 60:
        print(f"   in each whole minute: {', '.join(str(n) for n in per_minute(r))}")
    print(f"   not ok: {dict(failures) or 'none'}")
    print(
        f"   runs: {r.service.runs} ({r.runs_per_minute():.1f} a minute); checks answered by "
        f"another's run of their resource (its lease): {r.service.joined}"
    )
    if len(ok) >= 2:
        print(f"   latency {latency(ok)}")
        print(f"   p50/p95 ms of the checks sent in each minute: {latency_by_minute(r)}")
        print(f"   each resource's first check: median {first_checks(ok) * 1000:.0f} ms")
    counts = [max(c.count for c in ok if c.resource == n) for n in {c.resource for c in ok}]
    if counts:
        print(
            f"   checks per container (each resource's last count): median "
            f"{statistics.median(counts):.0f}, min {min(counts)}, max {max(counts)}"
        )
    total = sum(r.engine.values())
    print(f"   engine API requests: {total}, {total / max(1, len(r.checks)):.2f} per check")
    for kind, n in r.engine.most_common():
        print(f"     {n / max(1, len(r.checks)):6.2f}  {kind}  ({n})")
    phases = r.service.phases.items()
    print("   mean phase of a run: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in phases))
    print(f"   store calls: {r.service.store_calls}, {r.service.store_slow} of them over 1 s")
    warm = ", ".join(f"{k} {v:g}" for k, v in r.service.warm.items() if v)
    if warm:
        print(f"   warm metrics: {warm}")
    stalled = ", ".join(f"{kind} {share:.0%}" for kind, share in sorted(r.stalled.items()))
    print(f"   the machine during the load: some task waiting for {stalled} of the time")
    if r.memory is not None:
        report_memory(r.memory)


def report_memory(m: WarmMemory) -> None:
    n = max(1, m.containers)
    cgroups = "unread" if m.cgroups is None else f"{m.cgroups / 2**20:.1f} MiB"
    each = "" if m.cgroups is None else f" ({m.cgroups / n / 2**10:.0f} KiB each)"
    print(f"   warm containers at the end: {m.containers}, their cgroups {cgroups}{each}")
    print(
        f"   their conmon processes: {m.conmons} (one per container) + {m.exec_conmons} "
        f"(of the exec sessions Podman still keeps, two each), {m.conmon_pss / 2**20:.1f} MiB (PSS)"
    )


def per_minute(r: Result) -> list[int]:
    """Checks answered ok in each whole minute from the first send."""
    first = min(c.started for c in r.checks)
    ends = Counter(int((c.started + c.took - first) // 60) for c in r.ok())
    return [ends[m] for m in range(int(r.seconds // 60))]


def latency_by_minute(r: Result) -> str:
    """p50/p95 in ms of the checks sent in each minute (a tail that grows shows here)."""
    first = min(c.started for c in r.checks)
    minutes: dict[int, list[float]] = {}
    for c in r.ok():
        minutes.setdefault(int((c.started - first) // 60), []).append(c.took)
    parts = []
    for _, took in sorted(minutes.items()):
        if len(took) >= 2:
            p = percentiles(took)
            parts.append(f"{p['p50'] * 1000:.0f}/{p['p95'] * 1000:.0f}")
    return ", ".join(parts)


def latency(ok: list[Check]) -> str:
    p = percentiles([c.took for c in ok])
    return (
        f"p50 {p['p50'] * 1000:.0f} ms, p95 {p['p95'] * 1000:.0f} ms, "
        f"p99 {p['p99'] * 1000:.0f} ms, max {max(c.took for c in ok) * 1000:.0f} ms; "
        f"p95/p50 {p['p95'] / p['p50']:.2f}"
    )


def first_checks(ok: list[Check]) -> float:
    """The median time of each resource's first check (the warm way: its container's start)."""
    firsts: dict[int, Check] = {}
    for c in sorted(ok, key=lambda c: c.started):
        firsts.setdefault(c.resource, c)
    return statistics.median(c.took for c in firsts.values())


def report(results: dict[str, Result], load: Load) -> None:
    for r in results.values():
        report_way(r, load)
    if "on" not in results or "off" not in results:
        return
    on, off = results["on"], results["off"]
    print(f"\nwarm / new container: checks per minute {on.per_minute() / off.per_minute():.2f}x")
    if off.service.runs:
        print(f"  runs per minute {on.runs_per_minute() / off.runs_per_minute():.2f}x")
    if len(on.ok()) >= 2 and len(off.ok()) >= 2:
        p_on = percentiles([c.took for c in on.ok()])
        p_off = percentiles([c.took for c in off.ok()])
        for q in ("p50", "p95", "p99"):
            print(f"  latency {q}: new container / warm {p_off[q] / p_on[q]:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=50)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between checks")
    parser.add_argument("--seconds", type=float, default=300.0, help="length of each way's load")
    parser.add_argument("--clients", type=int, default=0, help="closed loop of K clients")
    parser.add_argument("--ways", default="off,on", help="WARM_CHECKS values, in order")
    parser.add_argument("--network", default="none", help="the resource containers' network")
    parser.add_argument(
        "--exit-command-delay",
        type=int,
        help="the Podman service's exit_command_delay (containers.conf; Podman's default 300)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (the logs)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warm-load-"))
    try:
        report(run(args, tmp), Load(args.resources, args.interval, args.seconds, args.clients))
    finally:
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Result]:
    """Each way of ``args.ways`` in turn, against one Podman service started here."""
    load = Load(args.resources, args.interval, args.seconds, args.clients)
    (tmp / "scripts").mkdir()
    (tmp / "scripts" / "check").write_text(CHECK_SCRIPT)
    (tmp / "scripts" / "check").chmod(0o755)
    image = build_resource_image(IMAGE_NAME, tmp / "scripts")
    print(f"image {image}; {os.cpu_count()} cores; load average {os.getloadavg()}")
    print(f"service caps raised for the load: {caps(load)}")
    if args.exit_command_delay is not None:
        print(f"Podman's exit_command_delay: {args.exit_command_delay} s")
    engine_log = tmp / "podman.log"
    engine = podman_service(
        tmp / "podman.sock", engine_log, engine_env(tmp, args.exit_command_delay), log_level="info"
    )
    docker_host = f"unix://{tmp / 'podman.sock'}"
    results = {}
    try:
        for warm in args.ways.split(","):
            env = service_env(tmp, docker_host, image, warm, load, args.network)
            results[warm] = measure(WAYS[warm], env, load, image, tmp)
            print(f"{WAYS[warm]} done; load average {os.getloadavg()}", flush=True)
    finally:
        engine.terminate()
        engine.wait(10)
    return results


if __name__ == "__main__":
    main()
