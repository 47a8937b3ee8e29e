"""Benchmark: a Tekton step's unpack and pack of an artifact, three ways, in one run against
the same S3 server (versitygw, started here on 127.0.0.1), alternating rounds:

    store       the direct access of before: the step holds the store's keys and does what
                ``artifact pack|unpack`` did (functions.cli.artifact.pack: upload_tree and
                the team record; unpack: download_tree)
    service     through the artifacts service (functions/tekton/artifact_service.py) under
                gunicorn, as ``serve artifacts`` runs it, with the pod's token: the shipped way
    presigned   unpack only: the service would answer a short-lived presigned GET URL of the
                one object and the step would download it straight from the store (the URL is
                made here with boto3, as the service would)

The API server's TokenReview is the one part that cannot run here: the service reviews with a
plain function (its decision kept a minute, as in production, so one review per run of
steps). The tree is ``--size-mib`` of incompressible files (so the artifact is that big);
each figure is the median of ``--rounds``; the ratios are each way's median over store's.
Goal (issue 39): service within 1.1x of store, both directions.

    python3 bench/tekton_artifacts.py --size-mib 100 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from functions.cli.artifact import ArtifactsService
from functions.cli.artifact import pack as pack_directly
from functions.cli.launch import free_port, wait_until
from storage import open_store
from storage.archive import ArchiveOptions, Limits, format_for_key
from storage.archive import unpack as unpack_stream
from storage.artifacts import add_team, download_tree, upload_tree
from storage.base import key_for_url
from testbed.versitygw import start_versitygw

MiB = 1 << 20
BUCKET = "bench-tekton-artifacts"
TOKEN = "bench-token"
TEAM = "bench"
SERVER = textwrap.dedent(
    """
    import sys
    from functions.http.senders import SenderCheck
    from functions.http.serving import serve
    from functions.tekton.artifact_service import create_artifacts_app
    from functions.tekton.namespace_teams import NamespaceTeams
    from storage import open_store
    from storage.tuning import StoreOptions

    url, port = sys.argv[1], int(sys.argv[2])
    review = lambda token, audience: "system:serviceaccount:bench:default"
    app = create_artifacts_app(
        open_store(url, StoreOptions(threads=16)),
        SenderCheck(review, "a", ("system:serviceaccount:*",)),
        NamespaceTeams({"bench": "bench"}),
        1 << 40,
    )
    serve(app, host="127.0.0.1", port=port, threads=16, whole_bodies=False)
    """
)


def make_tree(root: Path, size_mib: int) -> None:
    """Incompressible files of 4 MiB (and the rest), so the artifact is about the tree."""
    root.mkdir(parents=True)
    left = size_mib * MiB
    n = 0
    while left > 0:
        chunk = min(4 * MiB, left)
        (root / f"f{n:04d}.bin").write_bytes(os.urandom(chunk))
        left -= chunk
        n += 1


@contextmanager
def artifacts_service(store_url: str, env: dict[str, str], log: Path) -> Iterator[str]:
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVER, store_url, str(port)],
            env={**os.environ, **env, "PYTHONPATH": str(root)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(url), "the artifacts service", 30, interval=0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _up(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/healthz", timeout=1).ok
    except requests.RequestException:
        return False


def presigning_client(env: dict[str, str]) -> object:
    """A boto3 client that signs query strings with SigV4 (versitygw refuses SigV2 ones)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tekton-artifacts-"))
    try:
        return run(work, args.size_mib, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, size_mib: int, rounds: int) -> int:
    import requests

    tree = work / "tree"
    make_tree(tree, size_mib)
    options, limits = ArchiveOptions(), Limits()
    with start_versitygw(root=work / "s3", log=work / "s3.log") as s3:
        s3.client().create_bucket(Bucket=BUCKET)
        env = {k: v for k, v in s3.env().items() if v is not None}
        for name in [k for k, v in s3.env().items() if v is None]:
            os.environ.pop(name, None)
        os.environ.update(env)
        store_url = f"s3://{BUCKET}/bench"
        store = open_store(store_url)
        token = work / "token"
        token.write_text(TOKEN)
        client = presigning_client(env)
        with artifacts_service(store_url, env, work / "service.log") as url:
            service = ArtifactsService(url, token)
            packed = upload_tree(store, "artifacts/seed.tar.zst", tree, options)
            add_team(store, packed.key, TEAM)
            artifact = {"url": store.url_for(packed.key), "digest": packed.digest}

            def out() -> Path:
                target = work / "out"
                shutil.rmtree(target, ignore_errors=True)
                return target

            def presigned() -> None:
                key = key_for_url(store, artifact["url"])
                name = f"bench/{key}"
                link = client.generate_presigned_url(  # type: ignore[attr-defined]
                    "get_object", Params={"Bucket": BUCKET, "Key": name}, ExpiresIn=300
                )
                with requests.get(link, stream=True, timeout=60) as got:
                    got.raise_for_status()
                    got.raw.decode_content = False
                    unpack_stream(
                        got.raw,
                        out(),
                        format=format_for_key(name),
                        expected_digest=artifact["digest"],
                        limits=limits,
                    )

            ways: dict[str, Callable[[], object]] = {
                "unpack store": lambda: download_tree(
                    store, packed.key, out(), expected_digest=artifact["digest"], limits=limits
                ),
                "unpack service": lambda: service.unpack(artifact, out(), limits),
                "unpack presigned": presigned,
                "pack store": lambda: pack_directly(store, tree, options, team=TEAM),
                "pack service": lambda: service.pack(tree, options),
            }
            for action in ways.values():  # not counted: connections, caches, the review
                action()
            times: dict[str, list[float]] = {name: [] for name in ways}
            for round_ in range(rounds):
                order = list(ways)[round_ % len(ways) :] + list(ways)[: round_ % len(ways)]
                for name in order:
                    times[name].append(timed(ways[name]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{size_mib} MiB artifact (incompressible), {rounds} rounds, versitygw on loopback")
    for name, median in medians.items():
        direction = name.split()[0]
        ratio = median / medians[f"{direction} store"]
        rate = size_mib * MiB / median / 1e6
        spread = ", ".join(f"{t:.2f}" for t in times[name])
        print(
            f"  {name:17} median {median:6.3f} s  {rate:6.0f} MB/s  {ratio:5.2f}x store  ({spread})"
        )
    print(json.dumps({name: round(m, 4) for name, m in medians.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
