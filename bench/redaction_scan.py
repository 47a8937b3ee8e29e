"""What R2 of ``bench/redaction.py`` (3,200 secrets against one) is made of: the scan of the
same 4 MiB log, with its line breaks out, by the automaton alone, against the number of
anchors and the implementation; the whole search (scan and compares) with anchors at forms'
first bytes (as before), at their rarest bytes, and at their rarest bytes shared by at most
one secret's forms each (the redactor's), on this log, on it in upper case, on a hex dump and on
logs full of what encoders write; the redactor's fixed part (taking the breaks out, joining,
decoding); and, where they are installed (they are not dependencies), the two scanners whose
cost does not depend on the number of secrets: Hyperscan (``pip install hyperscan``) and a
filter of the text's aligned 8-byte blocks in a hashed bitmap (``pip install numpy``), each
with its build time. Medians of ``--rounds``.

    python3 bench/redaction_scan.py --rounds 9
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import ahocorasick_rs
from redaction import log_text, secret  # bench/redaction.py: it puts the repository on the path

import functions.redaction.redactor as redactor_module
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
    anchors = sorted({p[:ANCHOR_BYTES] for p in patterns})
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


def texts(flat: bytes) -> dict[str, bytes]:
    """The log, the log in upper case (the bytes the order calls rare), a hex dump (none of
    them), and 256 KiB each of three logs full of what encoders write: Go's JSON escapes of
    ``&``, .NET's of ``+`` and Windows paths JSON-escaped three times."""
    rows = range(8000)
    return {
        "this log": flat,
        "in upper case": flat.upper(),
        "a hex dump": random.Random(2).randbytes(len(flat) // 2).hex().encode(),
        "Go JSON (\\u0026), 256 KiB": "\n".join(
            f'{{"msg":"GET https://api.example.com/v1/items?page={i}\\u0026limit=50"}}'
            for i in rows
        ).encode()[: 1 << 18],
        ".NET JSON (\\u002B), 256 KiB": "\n".join(
            f'{{"Timestamp":"2026-12-01T12:00:{i % 60:02d}\\u002B00:00","Message":"step {i}"}}'
            for i in rows
        ).encode()[: 1 << 18],
        "paths escaped 3 times, 256 KiB": "\n".join(
            f'"path":"C:{sep}Users{sep}build{sep}{i}"' for i in rows for sep in ["\\" * 8]
        ).encode()[: 1 << 18],
    }


def anchored(choose: Callable[..., int], values: list[str]) -> Redactor:
    """A redactor whose forms are anchored by ``choose`` instead of ``anchor_at``."""
    real = redactor_module.anchor_at
    redactor_module.anchor_at = choose
    try:
        return Redactor(values)
    finally:
        redactor_module.anchor_at = real


_ANCHOR_AT = redactor_module.anchor_at
ANCHORINGS: dict[str, Callable[..., int]] = {
    "at the first byte": lambda pattern, secret, taken: 0,
    "at the rarest byte": lambda pattern, secret, taken: _ANCHOR_AT(pattern, secret, {}),
    "and one secret's": _ANCHOR_AT,  # the redactor's
}


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

    print("where anchors start, the whole search (scan and compares; one secret / 3,200):")
    pairs = {what: [anchored(c, pool[:1]), anchored(c, pool)] for what, c in ANCHORINGS.items()}
    for name, text in texts(flat).items():
        for what, pair in pairs.items():
            spent = [timed(lambda r=r, t=text: r.covered(t), args.rounds) for r in pair]
            print(
                f"  {name:>34}, {what:>22}: {spent[0]:6.1f} ms / {spent[1]:6.1f} ms "
                f"({spent[1] / spent[0]:4.1f}x; at most {max(map(len, pair[1]._anchored))} forms "
                "per anchor)"
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
    print("a run's build (forms, anchors, automaton), 3,200 secrets:")
    for what, choose in ANCHORINGS.items():
        build = timed(lambda c=choose: anchored(c, pool)._automaton, args.rounds)
        print(f"  {what:>22}: {build:6.0f} ms")
    print("for comparison, the automaton's build, 3,200 secrets (peak RSS grows, DFA last):")
    for kind in ("ContiguousNFA", "DFA"):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        built = timed(lambda k=kind: automaton(many._anchors, k), 3)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"  {kind:>13}: {built:.0f} ms, peak RSS +{grown:.0f} MiB")


if __name__ == "__main__":
    main()
