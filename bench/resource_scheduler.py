"""The Resources' scheduler's own cost (issue 51): N Resources checked every minute by the real
``functions.resources.scheduler.Scheduler`` against an in-memory Kubernetes API
(``testbed/tekton_fake_api.py``, which counts the requests it is sent), posting to an HTTP
sink on loopback that answers 202, each check answered at once through ``Scheduler.reply`` as the
controller's receiver would. After a first minute (every Resource's first slot), one minute is
measured:

    checks posted            per minute, and the busiest second's posts / the mean
    API requests             per minute, by verb (a claim and a reply: two status writes a check)
    CPU                      seconds of this process per minute (an upper bound: the in-memory
                             API, the sink and the replier run in it too)
    memory                   peak RSS, and its growth over the objects already held by the API

Beside it, the arithmetic of the same load as a CronJob per resource (not run here: a pod a
minute each, as the Tekton example did before Resources).

    python bench/resource_scheduler.py                       # 1,000 and 10,000
    python bench/resource_scheduler.py --sizes 1000 --minutes 1
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from functions.model import ResourceType
from functions.resources.decisions import API_VERSION, Context
from functions.resources.scheduler import Scheduler
from functions.tekton.decide import Reply
from testbed.tekton_fake_api import FakeTektonApi

IMAGE = "registry.test/git@sha256:" + "c" * 64


class CountingApi(FakeTektonApi):
    """The in-memory API, its requests counted by verb."""

    def __init__(self) -> None:
        super().__init__()
        self.verbs: Counter[str] = Counter()

    def list(self):  # type: ignore[override]
        self.verbs["list"] += 1
        return super().list()

    def watch(self, resource_version: str, seconds: int):  # type: ignore[override]
        self.verbs["watch"] += 1
        return super().watch(resource_version, seconds)

    def read(self, namespace: str, name: str):  # type: ignore[override]
        self.verbs["get"] += 1
        return super().read(namespace, name)

    def replace_status(self, run: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.verbs["update status"] += 1
        return super().replace_status(run, status)

    def event(self, run: dict[str, Any], warning: bool, reason: str, message: str) -> None:
        self.verbs["create event"] += 1
        super().event(run, warning, reason, message)


class Broker:
    """202 to every post; the checks kept for the replier, their arrival seconds counted."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str, str]] = []  # (id, subject, team)
        self.seconds: Counter[int] = Counter()
        self.lock = threading.Lock()
        broker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                found = (self.headers["ce-id"], self.headers["ce-subject"], self.headers["ce-team"])
                with broker.lock:
                    broker.pending.append(found)
                    broker.seconds[int(time.monotonic())] += 1
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> list[tuple[str, str, str]]:
        with self.lock:
            taken, self.pending = self.pending, []
        return taken


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(size: int, minutes: int) -> dict[str, Any]:
    api = CountingApi()
    for n in range(size):
        api.create(
            {
                "apiVersion": API_VERSION,
                "kind": "Resource",
                "metadata": {"name": f"r{n}", "namespace": f"team-{n % 10}", "generation": 1},
                "spec": {"type": "git", "source": {"uri": f"git://git.test/{n}.git"}},
            }
        )
    held = rss_mib()
    broker = Broker()
    ctx = Context(
        event_source="/bench",
        team_of=lambda namespace: namespace,
        resource_types={"git": ResourceType(image=IMAGE)},
    )
    scheduler = Scheduler(api, ctx, broker.url, workers=4)  # type: ignore[arg-type]
    stopped = threading.Event()
    threading.Thread(target=scheduler.run, args=(stopped,), daemon=True).start()

    def answer() -> None:
        while not stopped.is_set():
            for rid, subject, team in broker.take():
                namespace, name = subject.rsplit("/", 2)[-2:]
                reply = Reply(
                    rid,
                    True,
                    {"versions": [{"ref": "1"}]},
                    "check",
                    "/resource-functions/check",
                    team,
                )
                scheduler.reply(namespace, name, reply)
            time.sleep(0.05)

    threading.Thread(target=answer, daemon=True).start()
    time.sleep(60)  # every Resource's first slot
    verbs, cpu, start = Counter(api.verbs), time.process_time(), time.monotonic()
    time.sleep(60 * minutes)
    cpu, elapsed = time.process_time() - cpu, time.monotonic() - start
    stopped.set()
    requests = api.verbs - verbs
    seconds = [n for at, n in broker.seconds.items() if start <= at < start + elapsed - 1]
    posts = sum(seconds)
    per_minute = 60 / elapsed
    return {
        "size": size,
        "posts a minute": posts * per_minute,
        "busiest second / mean": max(seconds) / (posts / len(seconds)) if posts else 0.0,
        "API requests a minute": sum(requests.values()) * per_minute,
        "by verb": {verb: round(n * per_minute) for verb, n in sorted(requests.items())},
        "CPU s a minute": cpu * per_minute,
        "peak RSS MiB": rss_mib(),
        "RSS with the objects held MiB": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--minutes", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) > 1:  # each size in a process of its own: its own peak RSS
        import subprocess

        for size in sizes:
            command = [
                sys.executable,
                __file__,
                "--sizes",
                str(size),
                "--minutes",
                str(args.minutes),
            ]
            subprocess.run(command, check=True)
        return
    for size in sizes:
        found = measure(size, args.minutes)
        print(
            f"{size:>6} Resources every 60 s: {found['posts a minute']:.0f} checks posted a "
            f"minute (busiest second {found['busiest second / mean']:.2f}x the mean); "
            f"{found['API requests a minute']:.0f} API requests a minute {found['by verb']}; "
            f"CPU {found['CPU s a minute']:.1f} s a minute; peak RSS "
            f"{found['peak RSS MiB']:.0f} MiB ({found['RSS with the objects held MiB']:.0f} with "
            f"the objects held)"
        )
        print(
            f"{size:>6} CronJobs instead: {size} Jobs and {size} pods a minute "
            f"({size / 60:.1f} pod starts a second; Kubernetes' own steady-state bound on pod "
            f"churn is 20 a second per cluster)"
        )


if __name__ == "__main__":
    main()
