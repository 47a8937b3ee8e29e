"""``bench/artifacts.py --link RATE[,RATE…]``: artifacts over a shaped link, against baselines.

For each rate, versitygw runs in a network namespace of its own behind a veth pair shaped
with ``tc tbf`` at that rate in both directions (``shaped_link.py``; ``loopback`` runs it on
127.0.0.1 unshaped), and one round measures, one at a time:

    (b) upload      boto3 upload_file of an already made plain tar (the transfer bound)
    (a) upload      tar czf to a temp file, then boto3 upload_file
    ours upload     upload_tree at each of --levels (a child process, as in artifacts.py)
    (b) download    boto3 download_file of the plain tar, then tar xf
    (a) download    boto3 download_file of the .tgz, then tar xzf
    ours download   download_tree of each level's artifact

``--repeat N`` runs N rounds per rate, the order rotated every round, and reports medians.
Ratios are against (b) of the same direction: (b)'s median time / this median time. Every
extracted tree is kept until the end of the run (about 0.6 GB each for the 512 MiB tree):
creating files soon after deleting many is slow on ext4 (it skips inodes freed in the last
minutes), and that would land on whichever extraction came next.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import artifacts as bench
from shaped_link import LOOPBACK, exit_on_sigterm, shaped_link

PORT = 7070  # inside a namespace of our own: nothing else listens there
PLAIN_UP, PLAIN_DOWN = "(b) upload_file of plain tar", "(b) download_file + tar xf"
TGZ_UP, TGZ_DOWN = "(a) tar czf + upload_file", "(a) download_file + tar xzf"
LEVEL_STEP = 64 << 20  # the level over time: one figure per this much tar


def run_links(args: argparse.Namespace, work: Path, tree: Path, tree_bytes: int) -> None:
    exit_on_sigterm()
    plain = work / "tree.tar"
    subprocess.run(["tar", "cf", str(plain), "-C", str(tree), "."], check=True)
    print(f"plain tar: {plain.stat().st_size / 1e6:.1f} MB", flush=True)
    for rate in args.link:
        load = os.getloadavg()
        with link_server(rate, work / f"server-{rate}") as (env, server):
            os.environ.update(env)  # a script: the children and boto3 read it
            client = bench.s3_client()
            try:
                results = [
                    result
                    for index in range(args.repeat)
                    for result in link_round(client, tree, plain, work, args.levels, index, server)
                ]
            finally:
                bench.empty_bucket(client)
        print(link_report(rate, results, tree_bytes, plain.stat().st_size, args.repeat))
        print(f"  load average: {_load(load)} at the start, {_load(os.getloadavg())} at the end")


def _load(averages: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:.2f}" for value in averages)


@contextmanager
def link_server(rate: str, root: Path) -> Iterator[tuple[dict[str, str], int]]:
    """versitygw behind a link shaped at ``rate`` (or on loopback): its env and pid."""
    from testbed.versitygw import start_versitygw

    log, buckets = root / "versitygw.log", root / "buckets"
    root.mkdir(parents=True)
    if rate == LOOPBACK:
        with start_versitygw(root=buckets, log=log) as server:
            yield _env(server.env()), server.pid or 0
        return
    with (
        shaped_link(rate) as link,
        start_versitygw(
            link.peer, PORT, root=buckets, log=log, command_prefix=link.exec_prefix
        ) as server,
    ):
        yield _env(server.env()), server.pid or 0


def _env(env: dict[str, str | None]) -> dict[str, str]:
    return {name: value for name, value in env.items() if value is not None}


def link_round(
    client: Any,
    tree: Path,
    plain: Path,
    work: Path,
    levels: list[str],
    index: int,
    server: int,
) -> list[Result]:
    """Every measurement once, uploads first, each order rotated by ``index``."""
    out = work / "out" / f"{server}-round-{index}"  # kept to the end: see the module's doc
    out.mkdir(parents=True)
    url = f"s3://{bench.BUCKET}/bench"
    env = dict(os.environ)
    ups: list[Callable[[], bench.Result]] = [
        lambda: plain_upload(client, plain),
        lambda: tgz_upload(client, tree, work / "tree.tgz"),
        *(_ours_up(url, tree, env, level) for level in levels),
    ]
    downs: list[Callable[[], bench.Result]] = [
        lambda: plain_download(client, work / "down.tar", out / "b"),
        lambda: tgz_download(client, work / "down.tgz", out / "a"),
        *(_ours_down(url, out / f"ours-{level}", env, level) for level in levels),
    ]
    results = []
    for measures in (ups, downs):
        shift = index % len(measures)
        for measure in measures[shift:] + measures[:shift]:
            results.append(_with_server_cpu(measure, server))
    bench.empty_bucket(client)  # objects are written once: the next round writes them anew
    print(f"round {index + 1}: " + ", ".join(f"{r.name} {r.seconds:.2f} s" for r in results))
    return results


Result = bench.Result


def _ours_up(url: str, tree: Path, env: dict[str, str], level: str) -> Callable[[], Result]:
    key = f"artifacts/level-{level}.tar.zst"  # the round's objects are deleted after it
    return lambda: bench.ours("up", url, key, tree, {**env, "ARCHIVE_LEVEL": level}, f" {level}")


def _ours_down(url: str, out: Path, env: dict[str, str], level: str) -> Callable[[], Result]:
    key = f"artifacts/level-{level}.tar.zst"
    return lambda: bench.ours("down", url, key, out, env, f" {level}")


def _with_server_cpu(measure: Callable[[], Result], server: int) -> Result:
    before = bench.cpu_seconds(server)
    result = measure()
    return replace(result, server_cpu=bench.cpu_seconds(server) - before)


def plain_upload(client: Any, plain: Path) -> Result:
    seconds, cpu = _timed_cpu(
        lambda: client.upload_file(str(plain), bench.BUCKET, "bench/plain.tar")
    )
    return Result(PLAIN_UP, seconds, plain.stat().st_size, client_cpu=cpu)


def tgz_upload(client: Any, tree: Path, tgz: Path) -> Result:
    tar_czf, cpu_tar = _timed_cpu(
        lambda: subprocess.run(["tar", "czf", str(tgz), "-C", str(tree), "."], check=True)
    )
    upload, cpu_up = _timed_cpu(
        lambda: client.upload_file(str(tgz), bench.BUCKET, "bench/tree.tgz")
    )
    detail = f"tar czf {tar_czf:.2f} s + upload_file {upload:.2f} s"
    size = tgz.stat().st_size
    tgz.unlink()
    return Result(TGZ_UP, tar_czf + upload, size, client_cpu=cpu_tar + cpu_up, detail=detail)


def plain_download(client: Any, path: Path, out: Path) -> Result:
    return _download_and_extract(client, "bench/plain.tar", path, out, PLAIN_DOWN, "xf")


def tgz_download(client: Any, path: Path, out: Path) -> Result:
    return _download_and_extract(client, "bench/tree.tgz", path, out, TGZ_DOWN, "xzf")


def _download_and_extract(
    client: Any, key: str, path: Path, out: Path, name: str, flags: str
) -> Result:
    out.mkdir()
    download, cpu_down = _timed_cpu(lambda: client.download_file(bench.BUCKET, key, str(path)))
    extract, cpu_x = _timed_cpu(
        lambda: subprocess.run(["tar", flags, str(path), "-C", str(out)], check=True)
    )
    size = path.stat().st_size
    path.unlink()
    detail = f"download_file {download:.2f} s + tar {flags} {extract:.2f} s"
    return Result(name, download + extract, size, client_cpu=cpu_down + cpu_x, detail=detail)


def _timed_cpu(action: Callable[[], Any]) -> tuple[float, float]:
    """Wall time of ``action`` and the CPU it cost: this process's and its children's."""
    before = bench.cpu_seconds() + _children_cpu()
    seconds = bench.timed(action)
    return seconds, bench.cpu_seconds() + _children_cpu() - before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- report ---------------------------------------------------------------------------------


def link_report(
    rate: str, results: list[Result], tree_bytes: int, tar_bytes: int, rounds: int
) -> str:
    runs = bench.by_name(results)
    shaping = "unshaped, 127.0.0.1" if rate == LOOPBACK else "tc tbf on a veth pair, both ways"
    title = f"\nlink {rate} ({shaping}): medians of {rounds} round(s), ratios against (b)"
    header = (
        f"{'measurement':32} {'seconds':>8} {'min-max':>11} {'MB/s':>6} {'vs (b)':>7} "
        f"{'stored MB':>9} {'of tar':>6} {'client CPU':>10} {'server CPU':>10} {'RSS MiB':>7}"
    )
    lines = [title, header]
    baseline = {
        "up": statistics.median(r.seconds for r in runs[PLAIN_UP]),
        "down": statistics.median(r.seconds for r in runs[PLAIN_DOWN]),
    }
    lines += [_row(name, rs, baseline, tree_bytes, tar_bytes) for name, rs in runs.items()]
    lines += [f"  {rs[0].name}: {rs[0].detail} (round 1)" for rs in runs.values() if rs[0].detail]
    for name, rs in runs.items():
        for index, result in enumerate(rs):
            if result.levels:
                lines += [f"  {name}, round {index + 1}, the level over time:", *_levels(result)]
    return "\n".join(lines)


def _row(
    name: str, rs: list[Result], baseline: dict[str, float], tree_bytes: int, tar_bytes: int
) -> str:
    seconds = statistics.median(r.seconds for r in rs)
    spread = f"{min(r.seconds for r in rs):5.2f}-{max(r.seconds for r in rs):<5.2f}"
    versus = baseline["down" if "down" in name else "up"] / seconds
    stored = statistics.median(r.stored_bytes for r in rs)
    rss = max((r.rss_mib for r in rs if r.rss_mib is not None), default=None)
    return (
        f"{name:32} {seconds:8.2f} {spread} {tree_bytes / seconds / 1e6:6.1f} {versus:6.2f}x "
        f"{stored / 1e6:9.1f} {stored / tar_bytes:6.3f} {_median(rs, 'client_cpu'):>10} "
        f"{_median(rs, 'server_cpu'):>10} " + (f"{rss:7.0f}" if rss is not None else "")
    )


def _median(results: list[Result], field: str) -> str:
    values = [getattr(r, field) for r in results if getattr(r, field) is not None]
    return f"{statistics.median(values):.2f} s" if values else ""


def _levels(result: Result) -> list[str]:
    """One line per LEVEL_STEP of tar: the window that reached it, its level and waits."""
    lines = []
    for mark in range(LEVEL_STEP, int(result.levels[-1]["tar_bytes"]) + 1, LEVEL_STEP):
        w = next(w for w in result.levels if w["tar_bytes"] >= mark)
        idle = "?" if w["cpu_idle"] is None else f"{w['cpu_idle']:.2f}"
        lines.append(
            f"    {mark >> 20:5} MiB of tar at {w['elapsed']:5.2f} s: level"
            f" {w['archive_level']:.0f}; in that window the compressor waited"
            f" {w['compressor_waited']:4.0%}, the uploader {w['reader_waited']:4.0%}; stored"
            f" {w['stored_share']:.2f} of the tar; CPUs used {w['cpu_used']:.2f}, idle {idle}"
        )
    return lines


def main() -> None:
    """``bench/artifacts.py --link`` hands over to this script (so that ``artifacts.py``
    imports nothing of it): the same arguments, the same tree."""
    args = bench.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-artifacts-", dir=args.tmp))
    try:
        tree, tree_bytes = bench.prepare(args, work)
        run_links(args, work, tree, tree_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
