"""Benchmark: artifact pack+upload and download+unpack against tar/gzip + boto3 baselines.

Builds a tree (large files of mixed compressibility plus many small files) in a temp dir and
measures, in one run and against the same S3 server (versitygw, a real S3 server, started here
on 127.0.0.1; ``--s3-server moto`` for the moto emulator; or ``--s3-endpoint``) and a file store:

    ours      upload_tree / download_tree (storage.artifacts), in a child process whose peak
              RSS (VmHWM) is reported
    (a)       `tar czf` to a temp file + boto3 upload_file; boto3 download_file + `tar xzf`
    (b)       boto3 upload_file of an already made plain tar (the transfer bound)

Throughput is MB/s (10^6 bytes) of tree file bytes. Targets: ours >= 3x (a), >= 0.9x (b),
peak RSS of pack+upload to S3 < 150 MiB; the summary prints these ratios, all from this run.
``--rss-only`` packs into a file store and reports peak RSS only.

``--paired ROUNDS`` measures S3 uploads only, one at a time: each round uploads with (b) and
at each of ``--levels`` in turn (the order rotated every round), and the report gives per
setting the median time, P2 (the median of (b) over this median), client CPU (the uploading
process's own), the server's CPU (that of the versitygw started here, from /proc; left out
for other servers), stored bytes and peak RSS.

    python bench/artifacts.py --size-mib 200 --repeat 3
    python bench/artifacts.py --size-mib 512 --paired 5 --levels 3,1
    python bench/artifacts.py                       # ~1 GiB tree, each measurement once
    python bench/artifacts.py --rss-only --size-mib 2048
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shaped_link import parse_links

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 1 << 20
BUCKET = "bench-artifacts"
MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(frozen=True)
class Result:
    name: str
    seconds: float
    stored_bytes: int = 0
    rss_mib: float | None = None
    detail: str = ""  # how a baseline's time splits
    client_cpu: float | None = None  # seconds, user + system, of the uploading process
    server_cpu: float | None = None  # seconds, of the S3 server while this ran
    levels: tuple[dict[str, float], ...] = ()  # ARCHIVE_LEVEL=auto: its windows, in order


# --- the tree ------------------------------------------------------------------------------


def build_tree(root: Path, size_mib: int, small_files: int, seed: int = 1) -> int:
    """Write the benchmark tree; return its total file bytes.

    Large files come in three kinds, equal shares: random bytes (incompressible), text made
    of words (compresses ~3-4x) and bytes from a 16-symbol alphabet (~2x). Small files are
    word text of 100 B - 4 KiB in directories of 100.
    """
    rng = random.Random(seed)
    text = _word_text(rng, 8 * MiB)
    total = _small_files(root / "small", small_files, text, rng)
    large = max(size_mib * MiB - total, 6 * MiB)
    kinds: dict[str, Callable[[int], bytes]] = {
        "random": os.urandom,
        "text": lambda n: _text_slice(text, n, rng),
        "semi": lambda n: os.urandom(n).translate(bytes(i % 16 * 7 for i in range(256))),
    }
    for kind, make in kinds.items():
        for copy in range(2):
            total += _large_file(root / f"{kind}-{copy}.bin", large // 6, make)
    return total


def _word_text(rng: random.Random, size: int) -> bytes:
    words = [
        bytes(rng.choices(b"etaoinshrdlucmfwypvbgkqjxz", k=rng.randint(2, 10)))
        for _ in range(20_000)
    ]
    return b" ".join(rng.choices(words, k=size // 5))[:size]


def _text_slice(text: bytes, size: int, rng: random.Random) -> bytes:
    start = rng.randrange(len(text) - size)
    return text[start : start + size]


def _small_files(directory: Path, count: int, text: bytes, rng: random.Random) -> int:
    total = 0
    for index in range(count):
        folder = directory / f"d{index // 100:04d}"
        if index % 100 == 0:
            folder.mkdir(parents=True)
        data = _text_slice(text, rng.randint(100, 4096), rng)
        (folder / f"f{index:06d}.txt").write_bytes(data)
        total += len(data)
    return total


def _large_file(path: Path, size: int, make: Callable[[int], bytes]) -> int:
    with path.open("wb") as out:
        for offset in range(0, size, 4 * MiB):
            out.write(make(min(4 * MiB, size - offset)))
    return size


# --- servers and clients --------------------------------------------------------------------


@contextmanager
def s3_server(
    endpoint: str | None, kind: str, work: Path
) -> Iterator[tuple[dict[str, str], int | None]]:
    """Yield the environment for an S3 endpoint and the pid of a versitygw started here (for
    its CPU time; None otherwise): ``endpoint`` with the caller's credentials, or a server
    started for the run on 127.0.0.1: versitygw (a real S3 server, the default) or moto (a
    Python emulator; at ~85 MB/s it hides our own costs)."""
    if endpoint:
        yield {"AWS_ENDPOINT_URL_S3": endpoint}, None
        return
    if kind == "versitygw":
        from testbed.versitygw import start_versitygw

        with start_versitygw(root=work / "versitygw", log=work / "versitygw.log") as server:
            yield {k: v for k, v in server.env().items() if v is not None}, server.pid
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, process)
        yield {**MOTO_ENV, "AWS_ENDPOINT_URL_S3": url}, None
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_for(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"moto server did not start at {url}")


def s3_client() -> Any:
    """A boto3 client as the environment configures it (endpoint from AWS_ENDPOINT_URL_S3)."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client("s3", config=Config(s3={"addressing_style": "path"}))
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return client


# --- measurements ---------------------------------------------------------------------------


def timed(action: Callable[[], Any]) -> float:
    os.sync()  # write-back of the previous step must not be billed to this one
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def ours(
    direction: str, store_url: str, key: str, directory: Path, env: dict[str, str], label: str = ""
) -> Result:
    """Run upload_tree / download_tree in a child process; it reports time and VmHWM.
    ``label`` tells apart uploads of the same round (at several levels)."""
    command = [sys.executable, __file__, "--child", direction, store_url, key, str(directory)]
    os.sync()
    done = subprocess.run(command, env=env, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    scheme = store_url.split(":", 1)[0]
    name = f"ours {'pack+upload' if direction == 'up' else 'download+unpack'} ({scheme}){label}"
    hwm = report["hwm_kib"] / 1024
    levels = tuple(report["levels"])
    return Result(
        name, report["seconds"], report["size"], hwm, client_cpu=report["cpu"], levels=levels
    )


class _Windows(logging.Handler):
    """Collects the windows that ``ARCHIVE_LEVEL=auto`` logs (storage/archive/adaptive.py)."""

    FIELDS = (
        "elapsed",
        "tar_bytes",
        "archive_level",
        "compressor_waited",
        "reader_waited",
        "stored_share",
        "cpu_used",
        "cpu_idle",
    )

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.windows: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.windows.append({field: getattr(record, field) for field in self.FIELDS})


def child(direction: str, store_url: str, key: str, directory: str) -> None:
    from storage import open_store
    from storage.archive import ArchiveOptions
    from storage.artifacts import download_tree, upload_tree

    store = open_store(store_url)
    windows, logger = _Windows(), logging.getLogger("storage.archive.adaptive")
    logger.addHandler(windows)
    logger.setLevel(logging.DEBUG)
    cpu, start = cpu_seconds(), time.perf_counter()
    if direction == "up":
        size = upload_tree(store, key, directory, ArchiveOptions.from_env(os.environ)).size
    else:
        size = download_tree(store, key, directory).size
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    report = {"seconds": seconds, "size": size, "hwm_kib": _vm_hwm_kib(), "cpu": cpu}
    print(json.dumps({**report, "levels": windows.windows}))


def _vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time (all threads) of a process so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(
    client: Any, tree: Path, work: Path, stores: list[str], env: dict[str, str], levels: list[str]
) -> list[Result]:
    """Every measurement once; S3 uploads again at each further level of ``levels`` (the first
    level's artifacts are the ones downloaded). Extracted trees are kept until the end of the
    run: creating files soon after deleting many is slow on ext4 (it skips recently freed
    inodes), and that cost must not land on whichever measurement follows a clean-up."""
    work.mkdir()
    results = baselines(client, tree, work)
    for url in stores:
        key = f"artifacts/{work.name}.tar.zst"
        results.append(ours("up", url, key, tree, {**env, "ARCHIVE_LEVEL": levels[0]}))
        results.append(ours("down", url, key, work / f"out-{url.split(':')[0]}", env))
    for level in levels[1:]:
        key, level_env = f"artifacts/{work.name}-{level}.tar.zst", {**env, "ARCHIVE_LEVEL": level}
        results.append(ours("up", stores[0], key, tree, level_env, f" level {level}"))
    return results


def baselines(client: Any, tree: Path, work: Path) -> list[Result]:
    tgz, plain, key = work / "tree.tgz", work / "tree.tar", work.name
    tar_czf = timed(
        lambda: subprocess.run(["tar", "czf", str(tgz), "-C", str(tree), "."], check=True)
    )
    upload = timed(lambda: client.upload_file(str(tgz), BUCKET, f"{key}.tgz"))
    stored_a = tgz.stat().st_size
    tgz.unlink()
    (work / "out-a").mkdir()
    download = timed(lambda: client.download_file(BUCKET, f"{key}.tgz", str(tgz)))
    tar_xzf = timed(
        lambda: subprocess.run(["tar", "xzf", str(tgz), "-C", str(work / "out-a")], check=True)
    )
    tgz.unlink()
    subprocess.run(["tar", "cf", str(plain), "-C", str(tree), "."], check=True)
    b = plain_upload(client, plain, f"{key}.tar")
    plain.unlink()
    return [
        Result(
            "(a) tar czf + upload_file",
            tar_czf + upload,
            stored_a,
            detail=f"tar czf {tar_czf:.2f} s + upload_file {upload:.2f} s",
        ),
        Result(
            "(a) download_file + tar xzf",
            download + tar_xzf,
            stored_a,
            detail=f"download_file {download:.2f} s + tar xzf {tar_xzf:.2f} s",
        ),
        b,
    ]


def plain_upload(client: Any, plain: Path, key: str) -> Result:
    """(b): boto3 upload_file of a plain tar, with this process's CPU time."""
    os.sync()
    cpu = cpu_seconds()
    seconds = timed(lambda: client.upload_file(str(plain), BUCKET, key))
    size, cpu = plain.stat().st_size, cpu_seconds() - cpu
    return Result("(b) upload_file of plain tar", seconds, size, client_cpu=cpu)


def paired(
    client: Any,
    tree: Path,
    work: Path,
    env: dict[str, str],
    levels: list[str],
    rounds: int,
    server: int | None,
) -> list[Result]:
    """``rounds`` rounds of S3 uploads, one at a time: (b), then ours at each level, the order
    rotated every round; each object is deleted before the next upload. ``server``: the S3
    server's pid, for its CPU time."""
    plain = work / "tree.tar"
    subprocess.run(["tar", "cf", str(plain), "-C", str(tree), "."], check=True)
    settings: list[str | None] = [None, *levels]
    results = []
    for index in range(rounds):
        shift = index % len(settings)
        order = settings[shift:] + settings[:shift]
        done = [paired_upload(client, tree, plain, env, level, server) for level in order]
        rows = ", ".join(f"{r.name} {r.seconds:.2f} s" for r in done)
        print(f"round {index + 1}: {rows}", flush=True)  # progress, when the output is a file
        results += done
    return results


def paired_upload(
    client: Any, tree: Path, plain: Path, env: dict[str, str], level: str | None, server: int | None
) -> Result:
    """One upload, (b) if ``level`` is None, with the server's CPU time if ``server``."""
    before = cpu_seconds(server) if server else 0.0
    if level is None:
        result = plain_upload(client, plain, "bench/plain.tar")
    else:
        level_env = {**env, "ARCHIVE_LEVEL": level}
        key, url = "artifacts/paired.tar.zst", f"s3://{BUCKET}/bench"
        result = ours("up", url, key, tree, level_env, f" level {level}")
    if server:
        result = replace(result, server_cpu=cpu_seconds(server) - before)
    empty_bucket(client)
    return result


def best(results: list[Result]) -> list[Result]:
    """Per measurement, the fastest run (the least disturbed by the machine), and the
    highest peak RSS seen."""
    return [
        replace(
            min(rs, key=lambda r: r.seconds),
            rss_mib=max((r.rss_mib for r in rs if r.rss_mib is not None), default=None),
        )
        for rs in by_name(results).values()
    ]


def by_name(results: list[Result]) -> dict[str, list[Result]]:
    """The runs of each measurement, in the order first seen."""
    runs: dict[str, list[Result]] = {}
    for result in results:
        runs.setdefault(result.name, []).append(result)
    return runs


def empty_bucket(client: Any) -> None:
    """Delete what this script stored (and nothing else, should the bucket be shared)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            if item["Key"].startswith(("round-", "bench/")):
                client.delete_object(Bucket=BUCKET, Key=item["Key"])


# --- report ---------------------------------------------------------------------------------


def table(results: list[Result], tree_bytes: int) -> str:
    by_name = {result.name: result for result in results}
    header = (
        f"{'measurement':34} {'seconds':>8} {'MB/s':>8} {'stored MB':>10} "
        f"{'vs (a)':>7} {'vs (b)':>7} {'peak RSS MiB':>12}"
    )
    rows = [header]
    for result in results:
        rate = tree_bytes / result.seconds / 1e6
        vs_a, vs_b = _ratios(result, by_name)
        rss = f"{result.rss_mib:12.0f}" if result.rss_mib is not None else f"{'':12}"
        rows.append(
            f"{result.name:34} {result.seconds:8.2f} {rate:8.1f} "
            f"{result.stored_bytes / 1e6:10.1f} {vs_a:>7} {vs_b:>7} {rss}"
        )
    rows += [f"  {result.name}: {result.detail}" for result in results if result.detail]
    return "\n".join(rows)


def paired_table(results: list[Result]) -> str:
    """Per setting: medians (time and CPU), P2 against the median of (b), peak RSS."""
    runs = by_name(results)
    b = statistics.median(r.seconds for r in runs["(b) upload_file of plain tar"])
    server = all(r.server_cpu is not None for r in results)
    rows = [
        f"{'measurement':34} {'median s':>8} {'min-max s':>11} {'P2':>6} {'client CPU':>10} "
        + (f"{'server CPU':>10} " if server else "")
        + f"{'stored MB':>9} {'peak RSS MiB':>12}"
    ]
    for name, rs in runs.items():
        seconds = statistics.median(r.seconds for r in rs)
        spread = f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}"
        rss = max((r.rss_mib for r in rs if r.rss_mib is not None), default=None)
        rows.append(
            f"{name:34} {seconds:8.2f} {spread:>11} {b / seconds:5.2f}x "
            f"{_median_cpu(rs, 'client_cpu'):>10} "
            + (f"{_median_cpu(rs, 'server_cpu'):>10} " if server else "")
            + f"{rs[0].stored_bytes / 1e6:9.1f} "
            + (f"{rss:12.0f}" if rss is not None else f"{'':12}")
        )
    if not server:
        rows.append("  (no server CPU: the S3 server is not a versitygw started by this run)")
    return "\n".join(rows)


def _median_cpu(results: list[Result], field: str) -> str:
    return f"{statistics.median(getattr(r, field) for r in results):.2f} s"


def _ratios(result: Result, by_name: dict[str, Result]) -> tuple[str, str]:
    if not result.name.startswith("ours") or "(s3)" not in result.name:
        return "", ""
    upload = "upload" in result.name
    a = by_name["(a) tar czf + upload_file" if upload else "(a) download_file + tar xzf"]
    b = by_name["(b) upload_file of plain tar"] if upload else None
    vs_b = f"{b.seconds / result.seconds:6.2f}x" if b else ""
    return f"{a.seconds / result.seconds:6.2f}x", vs_b


def summary(results: list[Result]) -> str:
    """The issue's figures, as ratios of measurements from this run."""
    by_name = {result.name: result for result in results}
    up_s3, b = by_name["ours pack+upload (s3)"], by_name["(b) upload_file of plain tar"]
    down_s3, down_file = (
        by_name["ours download+unpack (s3)"],
        by_name["ours download+unpack (file)"],
    )
    p2 = b.seconds / up_s3.seconds
    file_vs_s3 = down_file.seconds / down_s3.seconds
    other_levels = [
        f"  at{r.name.rsplit(')', 1)[1]}: P2 {b.seconds / r.seconds:.2f}x, P3 {r.rss_mib:.0f} MiB, "
        f"{r.stored_bytes / 1e6:.1f} MB stored ({r.stored_bytes / up_s3.stored_bytes - 1:+.1%})"
        for r in results
        if r.name.startswith("ours pack+upload (s3) level")
    ]
    return "\n".join(
        [
            "summary:",
            f"  P2 pack+upload (s3) vs (b) upload_file of a plain tar: {p2:.2f}x (goal >= 0.9x)",
            f"  P3 peak RSS of pack+upload (s3): {up_s3.rss_mib:.0f} MiB (goal < 150 MiB)",
            f"  download+unpack time, file store / S3: {file_vs_s3:.2f} (below 1: file is faster)",
            *other_levels,
        ]
    )


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    if args.child:
        child(*args.child)
        return
    if args.link:  # its own script, which imports this one (not the other way round)
        link = str(Path(__file__).with_name("artifacts_link.py"))
        os.execv(sys.executable, [sys.executable, link, *sys.argv[1:]])
    work = Path(tempfile.mkdtemp(prefix="bench-artifacts-", dir=args.tmp))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, int]:
    """The tree of ``args`` built in ``work`` (and the header line printed): its path, bytes."""
    tree = work / "tree"
    start = time.perf_counter()
    tree_bytes = build_tree(tree, args.size_mib, args.small_files)
    print(
        f"tree: {tree_bytes / MiB:.0f} MiB in {args.small_files} small + 6 large files "
        f"(built in {time.perf_counter() - start:.0f} s); {os.cpu_count()} CPUs; "
        f"ARCHIVE_FORMAT={os.environ.get('ARCHIVE_FORMAT', 'zstd')} "
        f"ARCHIVE_LEVEL={','.join(args.levels)}",
        flush=True,
    )
    return tree, tree_bytes


def run(args: argparse.Namespace, work: Path) -> None:
    store_root = work / "store"
    store_root.mkdir()
    tree, tree_bytes = prepare(args, work)
    if args.rss_only:
        env = {**os.environ, "ARCHIVE_LEVEL": args.levels[0]}
        result = ours("up", store_root.as_uri(), "artifacts/rss.tar.zst", tree, env)
        print(table([result], tree_bytes))
        return
    with s3_server(args.s3_endpoint, args.s3_server, work) as (s3_env, server):
        os.environ.update(s3_env)  # a script: the children and boto3 read it
        client = s3_client()
        stores = [f"s3://{BUCKET}/bench", store_root.as_uri()]
        try:
            if args.paired:
                env, levels = dict(os.environ), args.levels
                results = paired(client, tree, work, env, levels, args.paired, server)
            else:
                results = [
                    result
                    for index in range(args.repeat)
                    for result in one_round(
                        client, tree, work / f"round-{index}", stores, dict(os.environ), args.levels
                    )
                ]
        finally:
            empty_bucket(client)
    if args.paired:
        print(f"medians of {args.paired} paired round(s), P2 = median of (b) / median:")
        print(paired_table(results))
        return
    print(f"best of {args.repeat} run(s) each:")
    print(table(best(results), tree_bytes))
    print(summary(best(results)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="tree size (default 1024)")
    parser.add_argument("--small-files", type=int, default=20_000)
    parser.add_argument("--s3-endpoint", help="use this S3 endpoint instead of starting a server")
    parser.add_argument(
        "--s3-server",
        choices=("versitygw", "moto"),
        default="versitygw",
        help="the S3 server to start on loopback (default versitygw)",
    )
    parser.add_argument(
        "--rss-only",
        action="store_true",
        help="only pack+upload into a file store and report peak RSS",
    )
    parser.add_argument("--tmp", help="directory for the tree and temp files")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement this many times, report the fastest",
    )
    parser.add_argument(
        "--levels",
        type=lambda text: text.split(","),
        default=[os.environ.get("ARCHIVE_LEVEL", "3")],
        help="compression levels to upload at, side by side (e.g. 3,1,-1; the first one is "
        "also downloaded; default ARCHIVE_LEVEL or 3)",
    )
    parser.add_argument(
        "--paired",
        type=int,
        metavar="ROUNDS",
        help="S3 uploads only, one at a time: (b) and each of --levels in turn, this many "
        "rounds; report medians",
    )
    parser.add_argument(
        "--link",
        type=_links,
        metavar="RATE[,RATE...]",
        help="S3 over a link shaped with tc at each rate (1gbit, 200mbit; loopback: unshaped) "
        "in one run: ours, (a) and (b), both directions (bench/artifacts_link.py; needs root)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args()


def _links(text: str) -> list[str]:
    try:
        return parse_links(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


if __name__ == "__main__":
    main()
