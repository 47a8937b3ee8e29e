"""Benchmark: the cost around a run (P5) and cache-hit throughput (P4), side by side in one run.

Starts what it needs on loopback: a Podman API service (unless ``DOCKER_HOST`` is set),
versitygw (a real S3 server), and the services as real processes (``python -m functions
serve``, gunicorn): a get service on a file store, a get service on the S3 store, a check
service. Then, in one run:

P4  cache-hit gets vs the same server's ``/healthz``: ``--clients`` concurrent keep-alive
    clients for ``--seconds`` each round, rounds alternating healthz / get; every get has a
    new event id (so it is a cache hit, not a redelivery). Throughput ratio per pair. p50 is
    that of one client at a time (under 16 clients that saturate the server, p50 is mostly
    queueing: 16 / throughput; printed beside it).
P5  a check through the service (HTTP -> container -> reply, sync) vs a bare
    ``podman run --rm -i IMAGE /opt/resource/check`` with the same stdin, alternating A B A B;
    wall time ratio per pair.

Figures are medians over pairs (min-max beside them); ratios are taken pair by pair, so a
drift of the machine's speed cancels. Goals: P4 >= 0.7x and p50 < 5 ms on both stores,
P5 <= 1.15x. The machines are shared and noisy: compare ratios from one run.

    python3 bench/latency.py
    python3 bench/latency.py --pairs 15 --rounds 5 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from functions.cli.busybox_image import build_resource_image
from functions.cli.launch import launch
from functions.keys import ANONYMOUS, run_id
from functions.protocol import stdin_payload
from testbed.podman import podman_service
from testbed.versitygw import start_versitygw

EXAMPLE = REPO / "examples" / "hello-resource"
BUCKET = "bench-latency"
SOURCE = {"latest": "3", "greeting": "hello"}
EVENT_SOURCE = "/bench/latency"
CACHE_SECRET = b"bench-latency"


# --- the parts: engine, S3 server, services ------------------------------------------------


@contextmanager
def engine(tmp: Path) -> Iterator[str]:
    """DOCKER_HOST as given, else a Podman API service started here."""
    if os.environ.get("DOCKER_HOST"):
        yield os.environ["DOCKER_HOST"]
        return
    sock = tmp / "podman.sock"
    proc = podman_service(sock, tmp / "podman.log")
    try:
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def service(action: str, env: dict[str, str], log: Path) -> Iterator[str]:
    """One service as a real process (``functions.cli.launch``); yields its URL once it
    serves."""
    with log.open("ab") as out:
        launched = launch({**os.environ, **env}, actions=(action,), output=out)
    try:
        launched.wait_serving(60)
        yield launched.urls[action]
    finally:
        launched.stop()


# --- HTTP: a lean keep-alive client, so the load generator costs little ---------------------


def event_request(path_host: str, action: str, data: dict[str, object], event_id: str) -> bytes:
    """A binary-mode CloudEvent POST as raw HTTP/1.1 bytes."""
    body = json.dumps(data).encode()
    headers = [
        "POST / HTTP/1.1",
        f"Host: {path_host}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "ce-specversion: 1.0",
        f"ce-type: dev.resourcefunctions.{action}.requested",
        f"ce-source: {EVENT_SOURCE}",
        f"ce-id: {event_id}",
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def get_request(host: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


class Connection:
    """One keep-alive connection; ``exchange`` sends a request and returns (status, body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def exchange(self, request: bytes) -> tuple[int, bytes, bytes]:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(head.split(b" ", 2)[1]), head, body

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class Load:
    per_second: float
    p50_ms: float
    failures: int


def load(port: int, make: Callable[[], bytes], *, clients: int, seconds: float) -> Load:
    """``clients`` threads, each on its own connection, send requests back to back."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(index: int) -> None:
        conn = Connection(port)
        start.wait()
        try:
            while not stop.is_set():
                request = make()
                began = time.perf_counter()
                status, _, _ = conn.exchange(request)
                latencies[index].append(time.perf_counter() - began)
                failures[index] += status != 200
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    every = [x for part in latencies for x in part]
    return Load(len(every) / elapsed, statistics.median(every) * 1000, sum(failures))


# --- P4 ------------------------------------------------------------------------------------


def cache_hit_vs_healthz(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Rounds alternating healthz / get; per round: both rates, the ratio, the get's p50."""
    port = int(url.rsplit(":", 1)[1])
    host = f"127.0.0.1:{port}"
    data = {"type": "hello", "source": SOURCE, "version": {"n": "3"}}
    status, head, body = Connection(port).exchange(event_request(host, "get", data, "prefill"))
    if status != 200 or b"get.succeeded" not in head:
        sys.exit(f"the prefill get failed: {status} {body[:300]!r}")
    healthz = get_request(host, "/healthz")
    figures: dict[str, list[float]] = {
        "healthz": [],
        "get": [],
        "ratio": [],
        "p50": [],
        "p50_loaded": [],
    }
    for _ in range(args.rounds):
        base = load(port, lambda: healthz, clients=args.clients, seconds=args.seconds)
        hits = load(
            port,
            lambda: event_request(host, "get", data, uuid.uuid4().hex),
            clients=args.clients,
            seconds=args.seconds,
        )
        if base.failures or hits.failures:
            sys.exit(f"failed requests: healthz {base.failures}, get {hits.failures}")
        figures["healthz"].append(base.per_second)
        figures["get"].append(hits.per_second)
        figures["ratio"].append(hits.per_second / base.per_second)
        figures["p50_loaded"].append(hits.p50_ms)
        alone = load(
            port,
            lambda: event_request(host, "get", data, uuid.uuid4().hex),
            clients=1,
            seconds=args.seconds / 2,
        )
        figures["p50"].append(alone.p50_ms)
    return figures


# --- P5 ------------------------------------------------------------------------------------


def check_vs_bare_run(url: str, image: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Pairs: a check through the service, then the bare ``podman run --rm -i`` of it."""
    port = int(url.rsplit(":", 1)[1])
    host = f"127.0.0.1:{port}"
    stdin = stdin_payload("check", SOURCE, None, {})
    network = ["--network", args.network] if args.network else []
    bare = ["podman", "run", "--rm", "-i", *network, image, "/opt/resource/check"]

    def through_service() -> float:
        event_id = uuid.uuid4().hex
        request = event_request(host, "check", {"type": "hello", "source": SOURCE}, event_id)
        conn = Connection(port)  # a new one: the server drops connections idle for 2 s
        began = time.perf_counter()
        status, head, body = conn.exchange(request)
        took = time.perf_counter() - began
        conn.close()
        if status != 200 or b"check.succeeded" not in head:
            sys.exit(f"check through the service failed: {status} {body[:300]!r}")
        # The service removes its container after replying: let that end before the bare
        # run, so it is not timed as part of the bare run.
        run = run_id(
            CACHE_SECRET,
            sender=ANONYMOUS,
            team="",
            event_source=EVENT_SOURCE,
            event_id=event_id,
            action="check",
        )
        gone(f"rf-{run}")
        return took

    def bare_run() -> float:
        began = time.perf_counter()
        done = subprocess.run(bare, input=stdin, capture_output=True, check=False)
        took = time.perf_counter() - began
        if done.returncode != 0:
            sys.exit(f"bare run failed: {done.stderr[-300:]!r}")
        return took

    through_service(), bare_run()  # warm-up: image and page caches, connections
    figures: dict[str, list[float]] = {"service": [], "bare": [], "ratio": []}
    for _ in range(args.pairs):
        service_s, bare_s = through_service(), bare_run()
        figures["service"].append(service_s * 1000)
        figures["bare"].append(bare_s * 1000)
        figures["ratio"].append(service_s / bare_s)
    return figures


def gone(container: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        exists = subprocess.run(["podman", "container", "exists", container], check=False)
        if exists.returncode == 1:
            return
        time.sleep(0.05)
    sys.exit(f"container {container} still there 30 s after its reply")


# --- report --------------------------------------------------------------------------------


def spread(values: list[float], unit: str = "", digits: int = 0) -> str:
    """median (min-max)"""
    fmt = f"{{:.{digits}f}}"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)}{unit} ({fmt.format(low)}-{fmt.format(high)})"


def report(p4: dict[str, dict[str, list[float]]], p5: dict[str, list[float]] | None) -> None:
    print("\nP4  cache-hit get vs /healthz of the same server (median (min-max) over rounds)")
    for store, figures in p4.items():
        print(
            f"    {store:5} healthz {spread(figures['healthz'], ' req/s')}, "
            f"get {spread(figures['get'], ' req/s')}, "
            f"ratio {spread(figures['ratio'], 'x', 2)}"
        )
        print(
            f"          get p50 {spread(figures['p50'], ' ms', 1)} one client at a time, "
            f"{spread(figures['p50_loaded'], ' ms', 1)} under load"
        )
    print("P5  check through the service vs bare podman run --rm -i (median (min-max) over pairs)")
    if p5:
        print(
            f"    service {spread(p5['service'], ' ms')}, bare {spread(p5['bare'], ' ms')}, "
            f"ratio {spread(p5['ratio'], 'x', 2)}"
        )
    print("\nsummary (goals: P4 >= 0.7x and p50 < 5 ms on both stores; P5 <= 1.15x)")
    for store, figures in p4.items():
        ratio, p50 = statistics.median(figures["ratio"]), statistics.median(figures["p50"])
        print(f"    P4 {store:5} {ratio:.2f}x, p50 {p50:.1f} ms")
    if p5:
        print(f"    P5       {statistics.median(p5['ratio']):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="P4 concurrent clients")
    parser.add_argument("--seconds", type=float, default=2.0, help="P4 length of each round")
    parser.add_argument("--rounds", type=int, default=3, help="P4 rounds of each kind")
    parser.add_argument("--pairs", type=int, default=10, help="P5 pairs of runs")
    parser.add_argument("--network", default="", help="container network of both P5 runs")
    parser.add_argument("--only", choices=("p4", "p5"), help="measure one of the two")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (service logs)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    try:
        run(args, tmp)
    finally:
        if args.keep:
            print(f"logs and stores kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    image = build_resource_image("localhost/hello-resource", EXAMPLE)
    with ExitStack() as stack:
        docker_host = stack.enter_context(engine(tmp))
        s3 = stack.enter_context(start_versitygw(root=tmp / "s3", log=tmp / "versitygw.log"))
        s3.client().create_bucket(Bucket=BUCKET)
        (tmp / "store").mkdir()
        common = {
            "DOCKER_HOST": docker_host,
            "RESOURCE_TYPES": json.dumps({"hello": image}),
            "CACHE_SECRET": CACHE_SECRET.decode(),
            "WORK_DIR": str(tmp),
            "CONTAINER_NETWORK": args.network,
            # P5 is a check in a new container each time (warm ones: bench/warm_check.py).
            "WARM_CHECKS": "off",
        }
        file_env = {**common, "STORE_URL": (tmp / "store").as_uri()}
        s3_env = {k: v for k, v in s3.env().items() if v is not None}
        s3_env = {**common, **s3_env, "STORE_URL": f"s3://{BUCKET}/bench"}
        urls = {
            "file": stack.enter_context(service("get", file_env, tmp / "get-file.log")),
            "s3": stack.enter_context(service("get", s3_env, tmp / "get-s3.log")),
            "check": stack.enter_context(service("check", file_env, tmp / "check.log")),
        }
        print(
            f"image {image}; engine {docker_host}; S3 versitygw {s3.endpoint}; {os.cpu_count()} cores"
        )
        p5 = check_vs_bare_run(urls["check"], image, args) if args.only != "p4" else None
        stores = ("file", "s3") if args.only != "p5" else ()
        p4 = {store: cache_hit_vs_healthz(urls[store], args) for store in stores}
    report(p4, p5)


if __name__ == "__main__":
    main()
