"""What R2 of ``bench/redaction.py`` (3,200 secrets against one) is made of: the scan of the
same 4 MiB log, with its line breaks out, by the automaton alone, against the number of
anchors, where anchors start in their forms (the first byte, as before, or the rarest, as
now; on this log, on it in upper case and on a hex dump) and the implementation; the redactor's fixed part (taking the breaks out, joining,
decoding); and, where they are installed (they are not dependencies), the two scanners whose
cost does not depend on the number of secrets: Hyperscan (``pip install hyperscan``) and a
filter of the text's aligned 8-byte blocks in a hashed bitmap (``pip install numpy``), each
with its build time. Medians of ``--rounds``.

    python3 bench/redaction_scan.py --rounds 9
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import ahocorasick_rs
from redaction import log_text, secret  # bench/redaction.py: it puts the repository on the path

from functions.redaction import Redactor
from functions.redaction.redactor import ANCHOR_BYTES, _flatten


def timed(action: Callable[[], object], rounds: int) -> float:
    """Milliseconds of ``action``, the median of ``rounds`` calls."""
    spent = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        spent.append(time.perf_counter() - start)
    return statistics.median(spent) * 1000


def automaton(anchors: list[bytes], kind: str) -> Any:
    implementation = getattr(ahocorasick_rs.Implementation, kind)
    return ahocorasick_rs.BytesAhoCorasick(anchors, implementation=implementation)


def hyperscan_scan(patterns: list[bytes], flat: bytes, rounds: int) -> str:
    try:
        import hyperscan  # type: ignore[import-not-found]
    except ImportError:
        return "not installed"
    anchors = sorted({p[:6] for p in patterns})
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    start = time.perf_counter()
    database.compile(
        expressions=anchors, ids=list(range(len(anchors))), flags=[0] * len(anchors), literal=True
    )
    built = (time.perf_counter() - start) * 1000
    scan = timed(lambda: database.scan(flat, match_event_handler=lambda *_: 0), rounds)
    return f"build {built:.0f} ms, scan {scan:.1f} ms"


def block_filter_scan(patterns: list[bytes], flat: bytes, rounds: int) -> str:
    try:
        import numpy  # type: ignore[import-not-found]
    except ImportError:
        return "not installed"
    start = time.perf_counter()
    blocks = {
        int.from_bytes(p[j : j + 8], "little") for p in patterns if len(p) >= 15 for j in range(8)
    }
    keys = numpy.array(sorted(blocks), dtype=numpy.uint64)
    multiplier, shift = numpy.uint64(0x9E3779B97F4A7C15), numpy.uint64(64 - 24)
    bitmap = numpy.zeros(1 << 24, dtype=bool)
    bitmap[(keys * multiplier) >> shift] = True
    built = (time.perf_counter() - start) * 1000

    def scan() -> object:
        values = numpy.frombuffer(flat, dtype=numpy.uint64, count=len(flat) // 8)
        candidates = numpy.flatnonzero(bitmap[(values * multiplier) >> shift])
        found = values[candidates]
        at = numpy.minimum(numpy.searchsorted(keys, found), len(keys) - 1)
        return candidates[keys[at] == found]

    return f"build {built:.0f} ms, scan {timed(scan, rounds):.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(18)  # the secrets and the log of bench/redaction.py
    pool = [secret(rng, n) for n in range(3200)]
    log = log_text(rng, pool[:1])
    flat, _ = _flatten(log)
    one, many = Redactor(pool[:1]), Redactor(pool)
    print(f"log: {len(log)} bytes, {len(flat)} without its line breaks")

    print("the scan against the number of anchors (contiguous NFA; anchors of 3,200 secrets):")
    shuffled = list(many._anchors)
    random.Random(1).shuffle(shuffled)
    for count in (len(one._anchors), 20, 200, 1000, len(shuffled)):
        chosen = one._anchors if count == len(one._anchors) else shuffled[:count]
        scanner = automaton(chosen, "ContiguousNFA")
        scan = timed(
            lambda s=scanner: s.find_matches_as_indexes(flat, overlapping=True), args.rounds
        )
        what = "one secret's" if chosen is one._anchors else "of 3,200 secrets"
        print(f"  {count:>6} anchors ({what}): {scan:6.1f} ms")

    print("the implementation (one secret / 3,200):")
    for kind in ("ContiguousNFA", "DFA"):
        scans = []
        for redactor in (one, many):
            scanner = automaton(redactor._anchors, kind)
            scans.append(
                timed(
                    lambda s=scanner: s.find_matches_as_indexes(flat, overlapping=True), args.rounds
                )
            )
        print(f"  {kind:>13}: {scans[0]:6.1f} ms / {scans[1]:6.1f} ms ({scans[1] / scans[0]:.1f}x)")

    print("where anchors start in their forms (one secret / 3,200):")
    hex_dump = random.Random(2).randbytes(len(flat) // 2).hex().encode()
    for text, name in (
        (flat, "this log"),
        (flat.upper(), "in upper case"),
        (hex_dump, "a hex dump"),
    ):
        for what, choose in (
            ("at the first byte", lambda r: sorted({p[:ANCHOR_BYTES] for p in r._patterns})),
            ("at the rarest byte (the redactor's)", lambda r: r._anchors),
        ):
            scans = []
            for redactor in (one, many):
                scanner = automaton(choose(redactor), "ContiguousNFA")
                scans.append(
                    timed(
                        lambda s=scanner, t=text: s.find_matches_as_indexes(t, overlapping=True),
                        args.rounds,
                    )
                )
            print(
                f"  {name:>13}, {what:>35}: {scans[0]:6.1f} ms / {scans[1]:6.1f} ms "
                f"({scans[1] / scans[0]:.1f}x)"
            )

    window = len(log)
    fixed = timed(lambda: one.tail(log, window).decode("utf-8", "replace"), args.rounds)
    scan_one = timed(
        lambda: one._automaton.find_matches_as_indexes(flat, overlapping=True), args.rounds
    )
    print(f"the redactor against one secret: {fixed:.1f} ms, of which the scan {scan_one:.1f} ms")

    print("scanners whose cost does not depend on the number of secrets (3,200 secrets):")
    print(f"  Hyperscan (6-byte anchors): {hyperscan_scan(many._patterns, flat, args.rounds)}")
    print(
        f"  aligned 8-byte blocks (numpy): {block_filter_scan(many._patterns, flat, args.rounds)}"
    )
    print(
        f"  for comparison, the automaton: build {timed(lambda: automaton(many._anchors, 'ContiguousNFA'), 3):.0f} ms"
    )


if __name__ == "__main__":
    main()
