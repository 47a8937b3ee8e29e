"""Warm check containers (issue 30, docs/warm-checks.md): a git check after one new commit,
three ways, on the same repository in the same run.

    warm service   a check through the check service (WARM_CHECKS=on): an exec in the
                   resource's warm container, which kept the clone in $TMPDIR
    bare exec      ``podman exec -i`` of the same check in a container already running
                   (what a Concourse worker does): the floor
    new container  a check through the check service with WARM_CHECKS=off: a new container
                   per check, as before, which clones the whole repository again

The repository: about ``--history-mb`` of history made with git fast-import (``--shape
source``, the default: a source tree's history, many small commits to text files stored as
deltas; ``--shape random``: one commit per MiB of random data, the cheapest to clone; see
``make_repository``), served by ``git daemon`` on loopback; containers use the host's
network. Each round adds one commit, then times one check each way (each way has its
own clone, so each sees exactly one new commit). The first check of each way (a full clone) is
reported apart. Prints the medians and the ratios: goals are warm/bare <= 1.3 and
new/warm >= 10.

``--image``: a resource image with git-resource's check (``source.uri``, ``source.branch``);
by default Concourse's git-resource, built from ``../shared/third_party/git-resource-*.tar.xz``
(``tests/support/real_resources.py``, as ``.ci/setup --tests`` builds it). The project's
git test resource (``tests.support.fidelity_resources.git_repo_resource()``) also answers it,
but its check (``git ls-remote``) keeps no clone.

    python3 bench/warm_check.py --history-mb 300 --rounds 3
    python3 bench/warm_check.py --history-mb 300 --rounds 3 --shape random
    python3 bench/warm_check.py --history-mb 20 --rounds 1    # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests

from functions.cli.launch import Launched, launch
from functions.cli.send import request_event
from functions.events import to_http
from testbed.git_daemon import git_daemon
from testbed.git_history import add_commit, make_repository
from testbed.podman import podman_service

REAL_GIT_RESOURCE = "localhost/rf-git-resource"


def default_image() -> str:
    """Concourse's git-resource as ``.ci/setup --tests`` builds it (``python3 -m
    tests.support.real_resources``), found in the engine by its name; else ``--image``."""
    found = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", REAL_GIT_RESOURCE],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not found:
        raise SystemExit(
            f"no {REAL_GIT_RESOURCE} image: build it (python3 -m tests.support.real_resources)"
            " or pass --image"
        )
    return found[0]


def through_service(service: Launched, source: dict[str, str], version: object) -> float:
    """One check through the service (a binary-mode CloudEvent); its seconds."""
    data = {"type": "git", "source": source, "version": version}
    headers, body = to_http(request_event("check", data, source="/bench/warm-check"))
    started = time.perf_counter()
    answer = requests.post(service.urls["check"], headers=headers, data=body, timeout=600)
    took = time.perf_counter() - started
    if answer.status_code != 200 or "error" in answer.json():
        raise SystemExit(
            f"check through the service failed: {answer.status_code} {answer.text[:500]}"
        )
    return took


def bare_exec(container: str, source: dict[str, str], version: object) -> float:
    payload = json.dumps({"source": source, "version": version}).encode()
    started = time.perf_counter()
    done = subprocess.run(
        ["podman", "exec", "-i", container, "/opt/resource/check"],
        input=payload,
        capture_output=True,
        check=False,
    )
    took = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"bare exec failed: {done.stderr.decode()[-500:]}")
    return took


def service(tmp: Path, docker_host: str, image: str, warm: str) -> Launched:
    """The check service (the project's launcher), reuse ``warm`` (on/off)."""
    store = tmp / f"store-{warm}"
    store.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("K_")},
        "RUNTIME": "container",
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": json.dumps({"git": image}),
        "CACHE_SECRET": "bench",
        "STORE_URL": store.as_uri(),
        "WORK_DIR": str(tmp),
        "CONTAINER_NETWORK": "host",
        "WARM_CHECKS": warm,
    }
    with open(tmp / f"service-{warm}.log", "ab") as log:
        launched = launch(env, actions=("check",), output=log)
    launched.wait_serving()
    return launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history-mb", type=int, default=300)
    parser.add_argument("--shape", choices=("source", "random"), default="source")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", default="")
    args = parser.parse_args()
    image = args.image or default_image()
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as name:
        tmp = Path(name)
        repos = tmp / "repos"
        repos.mkdir()
        started = time.perf_counter()
        make_repository(repos / "repo.git", args.history_mb, args.shape)
        size = sum(f.stat().st_size for f in (repos / "repo.git").rglob("*") if f.is_file())
        print(f"image {image}")
        print(
            f"repository ({args.shape} history): {size / 2**20:.0f} MiB on disk "
            f"(made in {time.perf_counter() - started:.0f} s)"
        )
        engine = podman_service(tmp / "podman.sock", tmp / "podman.log")
        docker_host = f"unix://{tmp / 'podman.sock'}"
        with git_daemon(repos) as port:
            source = {"uri": f"git://127.0.0.1:{port}/repo.git", "branch": "main"}
            warm = service(tmp, docker_host, image, "on")
            cold = service(tmp, docker_host, image, "off")
            bare = subprocess.run(
                ["podman", "run", "-d", "--network=host", "--entrypoint=sleep", image, "inf"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            try:
                firsts = {
                    "warm service": through_service(warm, source, None),
                    "bare exec": bare_exec(bare, source, None),
                    "new container": through_service(cold, source, None),
                }
                times: dict[str, list[float]] = {way: [] for way in firsts}
                for n in range(args.rounds):
                    add_commit(repos / "repo.git", n)
                    times["warm service"].append(through_service(warm, source, None))
                    times["bare exec"].append(bare_exec(bare, source, None))
                    times["new container"].append(through_service(cold, source, None))
            finally:
                subprocess.run(["podman", "rm", "-f", bare], capture_output=True, check=False)
                warm.stop()
                cold.stop()
                engine.terminate()
                engine.wait(10)
    median = {way: statistics.median(values) for way, values in times.items()}
    print(f"{'way':<14} {'first (clone)':>14} {'after 1 commit (median)':>24}  all")
    for way, values in times.items():
        rounded = ", ".join(f"{v:.2f}" for v in values)
        print(f"{way:<14} {firsts[way]:>12.2f} s {median[way]:>22.3f} s  [{rounded}]")
    print(f"warm service / bare exec:    {median['warm service'] / median['bare exec']:.2f}x")
    print(f"new container / warm service: {median['new container'] / median['warm service']:.1f}x")


if __name__ == "__main__":
    main()
