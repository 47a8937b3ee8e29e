"""Benchmark: redacting a 4 MiB log against 1, 100 and 3,200 secrets (issue 18).

What is timed is what ``collect`` does with a run's stderr: ``Redactor.tail`` over the kept
tail plus its window (``MAX_STDERR_BYTES`` + ``window``), then the UTF-8 decode. The
automaton's build (once per run) is timed apart. The log is a CI log made up here: git
progress redraws, compiler and pip lines, SHAs, URLs, base64 and hex blobs, with some of the
secrets in it, raw and in other forms (so matches are mapped and replaced, as in a real log
that leaks). The secrets are a mix of tokens, passwords with punctuation and URL-safe
keys, about 20 characters each (3,200 of them: about 66 KB of stdin, as in the issue).

Each of ``--rounds`` rounds times every count in turn. Figures: medians of wall and CPU time
(this process's: on a shared machine the steadier one), MB/s of the log's 4 MiB (10^6 bytes;
the window redacted is a little longer), and the ratio of the time at the last count (3,200)
to the time at the first (1), round by round. Goals: >= 50 MB/s at 3,200 secrets, ratio <= 2.

    python3 bench/redaction.py
    python3 bench/redaction.py --rounds 15 --counts 1,100,3200,10000
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from functions.protocol import MAX_STDERR_BYTES
from functions.redaction import Redactor

LOG_BYTES = 4 * 1024 * 1024
LEAKS = 64  # occurrences of secrets in the log


def secret(rng: random.Random, n: int) -> str:
    kind = n % 3
    if kind == 0:  # a token
        return "ghp_" + "".join(rng.choices(string.ascii_letters + string.digits, k=16))
    if kind == 1:  # a password
        return "".join(rng.choices(string.ascii_letters + string.digits + "!@#$%&*+=/", k=18))
    return "".join(rng.choices(string.ascii_letters + string.digits + "-_", k=22))


def log_text(rng: random.Random, secrets: list[str]) -> bytes:
    words = ["the", "of", "build", "step", "cache", "layer", "fetch", "ok", "error", "done"]

    def line(i: int) -> str:
        kind = i % 8
        if kind == 0:
            return "".join(f"Receiving objects: {p}% ({p}/100)\r" for p in range(0, 101, 10))
        if kind == 1:
            return f"gcc -O2 -c src/module_{i}.c -o build/module_{i}.o -Iinclude -DVERSION=1.{i}"
        if kind == 2:
            return f"commit {rng.getrandbits(160):040x}"
        if kind == 3:
            return f"GET https://registry.example.com/v2/library/app/blobs/sha256:{i:064x}"
        if kind == 4:
            return base64.b64encode(rng.randbytes(57)).decode()
        if kind == 5:
            return f"Collecting package-{i}==1.{i % 17}.0 (from -r requirements.txt (line {i}))"
        if kind == 6:
            return f"2026-12-01T12:00:{i % 60:02d}Z " + " ".join(rng.choices(words, k=9))
        return f"  {rng.randbytes(24).hex()}  |{rng.choice(words)}|"

    lines, size = [], 0
    while size < LOG_BYTES:
        lines.append(line(len(lines)))
        size += len(lines[-1]) + 1
    for n in range(LEAKS):  # raw, percent-encoded, in a Basic header, JSON-escaped
        value = secrets[n % len(secrets)]
        shown = [
            f"password={value}",
            f"https://user:{quote(value, safe='')}@git.example.com/repo.git",
            "Authorization: Basic " + base64.b64encode(f"ci:{value}".encode()).decode(),
            json.dumps({"token": value}),
        ][n % 4]
        lines.insert(rng.randrange(len(lines) // 2, len(lines)), shown)  # in the last 2 MiB
    return ("\n".join(lines).encode())[-LOG_BYTES:]


def once(action: Callable[[], object]) -> tuple[float, float, object]:
    """Wall and CPU seconds (this process's: waiting for a core is not in it) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,100,3200", help="numbers of secrets")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    counts = [int(n) for n in args.counts.split(",")]
    rng = random.Random(18)
    pool = [secret(rng, n) for n in range(max(counts))]
    print(f"stdin of {max(counts)} secrets: {len(json.dumps({'source': pool}))} bytes")
    log = log_text(rng, pool[: min(counts)])  # the same log for every count
    lines = log.count(b"\n")
    print(f"log: {len(log)} bytes, {lines} lines, {LEAKS} leaks")
    runs: dict[int, Callable[[], object]] = {}
    for count in counts:
        forms, _, redactor = once(lambda c=count: Redactor(pool[:c]))
        assert isinstance(redactor, Redactor)
        build, _, _ = once(lambda r=redactor: r._automaton)
        window = log[-(MAX_STDERR_BYTES + redactor.window) :]
        runs[count] = lambda r=redactor, w=window: r.tail(w, MAX_STDERR_BYTES).decode(
            "utf-8", "replace"
        )
        out = runs[count]()
        assert isinstance(out, str) and pool[0] not in out, "a secret survived"
        print(
            f"{count:>6} secrets: {len(redactor._patterns):>6} patterns, forms {forms:5.3f} s, "
            f"automaton {build:5.3f} s, {len(window)} bytes redacted, "
            f"{out.count('[redacted]')} redactions"
        )
    # Rounds: each count in turn, so a drift of the machine's speed falls on all of them.
    times: dict[int, list[tuple[float, float]]] = {count: [] for count in counts}
    for _ in range(args.rounds):
        for count in counts:
            wall, cpu, _ = once(runs[count])
            times[count].append((wall, cpu))
    size = len(log)
    for count in counts:
        wall = statistics.median(t[0] for t in times[count])
        cpu = statistics.median(t[1] for t in times[count])
        print(
            f"{count:>6} secrets: {wall * 1000:6.1f} ms wall = {size / wall / 1e6:5.1f} MB/s, "
            f"{cpu * 1000:6.1f} ms CPU = {size / cpu / 1e6:5.1f} MB/s (medians of {args.rounds})"
        )
    first, last = counts[0], counts[-1]
    for kind, i in (("wall", 0), ("CPU", 1)):
        ratios = [b[i] / a[i] for a, b in zip(times[first], times[last], strict=True)]
        print(
            f"time at {last} / time at {first}, {kind}: median {statistics.median(ratios):.2f}x "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}; goal <= 2x)"
        )


if __name__ == "__main__":
    main()
