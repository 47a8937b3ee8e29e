"""No task container outlives its use. A service stopped right after a reply (SIGTERM, or
Ctrl-C mid-run) drains: its runs finish and their containers and work dirs are removed
before it exits. A service killed right after a reply leaves them, and the next start
sweeps them; it leaves alone what a redelivery needs (running containers, exited ones
without a stored result) and the finished runs of a service with another store. Real
services under gunicorn, real Podman."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from functions.cli.launch import wait_until
from testbed.event_sink import event_sink
from tests.support.engine import containers_of, service_env, wait_running
from tests.support.events import request_event, send
from tests.support.runs import run_of as run_id_of
from tests.support.services import Services, start_services


def get_event(delay: int = 0, **extensions: str) -> Any:
    source = {"delay": delay, "nonce": uuid.uuid4().hex} if delay else {"nonce": uuid.uuid4().hex}
    return request_event(
        "get", {"type": "test", "source": source, "version": {"ref": "1"}}, **extensions
    )


def run_of(event: Any) -> str:
    return run_id_of("e2e", event.get_source(), event.get_id(), "get")  # service_env's secret


def get_service(env: dict[str, str], log: Path) -> Services:
    return start_services({**env, "LOG_LEVEL": "debug"}, log, actions=("get",))


def service_pids(services: Services) -> list[int]:
    """The gunicorn worker(s), then the master: what a terminal's Ctrl-C or a crash reaches."""
    master = services.procs[0].pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children] + [master]


def kill(services: Services) -> None:
    """SIGKILL the whole service at once, as an OOM kill or a node loss would."""
    for pid in service_pids(services):
        os.kill(pid, signal.SIGKILL)
    services.procs[0].wait(10)


def leftover(docker_host: str, run: str) -> bool:
    return bool(containers_of(docker_host, run))


def status(docker_host: str, run: str) -> str:
    found = containers_of(docker_host, run)
    return found[0].status if found else "gone"


def send_in_background(url: str, event: Any, codes: list[int] | None = None) -> threading.Thread:
    """POST ``event`` from a thread; its status code goes to ``codes`` (none if cut off)."""

    def post() -> None:
        try:
            code, _, _ = send(url, event, timeout=60)
        except requests.RequestException:
            return  # the service died under it
        if codes is not None:
            codes.append(code)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def remove_containers(docker_host: str, runs: list[str]) -> None:
    for run in runs:
        for container in containers_of(docker_host, run):
            container.remove(force=True)


def swept(docker_host: str, run: str, log: Path) -> dict[str, Any]:
    """Wait until the start sweep has removed ``run``'s container; its log line (a sweep
    logs once it is through, so it has looked at every other container too)."""
    wait_until(lambda: not leftover(docker_host, run), "the start sweep's removal", timeout=30)
    return first_sweep(log)


def first_sweep(log: Path) -> dict[str, Any]:
    """The service's log line of its first sweep."""
    found: list[dict[str, Any]] = []

    def swept() -> bool:
        for line in log.read_text(errors="replace").splitlines():
            if '"sweep done"' in line:
                found.append(json.loads(line))
                return True
        return False

    wait_until(swept, "the start sweep", timeout=30)
    return found[0]


def finished_leftover(env: dict[str, str], log: Path, docker_host: str) -> str:
    """The run id of a finished get whose service was killed right after its reply, before
    it removed the container. The removal follows the reply within a few tens of ms, so the
    kill is sometimes too late: then another try (each one a fresh service)."""
    for _ in range(6):
        services = get_service(env, log)
        event = get_event()
        try:
            code, _, _ = send(services.urls["get"], event)
            kill(services)
        finally:
            services.stop()
        assert code == 200
        if leftover(docker_host, run_of(event)):
            return run_of(event)
    pytest.fail("each kill came after the container's removal")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_right_after_a_reply_leaves_no_container(
    mode, docker_host, resource_image, tmp_path
):
    with event_sink() as sink:
        env = {**service_env(docker_host, resource_image, tmp_path), "K_SINK": sink.url}
        services = get_service(env, tmp_path / "service.log")
        # async: the 202 comes at once and the script is still sleeping when SIGTERM comes
        event = get_event(delay=2, replymode="async") if mode == "async" else get_event()
        try:
            code, _, _ = send(services.urls["get"], event)
            services.procs[0].terminate()
            assert services.procs[0].wait(40) == 0
        finally:
            services.stop()
        assert code == (202 if mode == "async" else 200)
        if mode == "async":  # the run was not cut short: it replied, and succeeded
            reply = sink.next(5)
            assert reply.get_type() == "dev.resourcefunctions.get.succeeded", reply.get_data()
    run = run_of(event)
    assert (tmp_path / "store" / "results" / f"{run}.json").exists()
    assert not leftover(docker_host, run)
    assert not (tmp_path / f"rf-{run}").exists()


def test_ctrl_c_mid_run_lets_the_run_finish_and_leaves_no_container(
    docker_host, resource_image, tmp_path
):
    services = get_service(service_env(docker_host, resource_image, tmp_path), tmp_path / "s.log")
    event = get_event(delay=2)
    run = run_of(event)
    replies: list[int] = []
    try:
        thread = send_in_background(services.urls["get"], event, replies)
        wait_running(docker_host, run)
        for pid in service_pids(services):  # a terminal's Ctrl-C: SIGINT to the whole group
            os.kill(pid, signal.SIGINT)
        assert services.procs[0].wait(40) == 0
        thread.join(10)
    finally:
        services.stop()
    assert replies == [200]  # the run finished: not a 503 for the redelivery to repeat
    assert not leftover(docker_host, run)
    assert not (tmp_path / f"rf-{run}").exists()


def test_the_next_start_sweeps_a_killed_service_leftovers(docker_host, resource_image, tmp_path):
    env = service_env(docker_host, resource_image, tmp_path)
    run = finished_leftover(env, tmp_path / "first.log", docker_host)
    assert (tmp_path / f"rf-{run}").exists()  # its work dir, left with it
    services = get_service(env, tmp_path / "next.log")
    try:
        sweep = swept(docker_host, run, tmp_path / "next.log")
    finally:
        services.stop()
        remove_containers(docker_host, [run])  # if the sweep failed to
    assert sweep["removed"] == 1
    assert not (tmp_path / f"rf-{run}").exists()


def test_the_sweep_leaves_what_a_redelivery_needs(docker_host, resource_image, tmp_path):
    env = service_env(docker_host, resource_image, tmp_path)
    other = tmp_path / "other"  # a service of its own store on the same engine
    other.mkdir()
    other_env = service_env(docker_host, resource_image, other)
    running, unfinished = get_event(delay=120), get_event(delay=3)
    made = [run_of(running), run_of(unfinished)]
    try:
        crashed = get_service(env, tmp_path / "crashed.log")
        try:
            for event in (running, unfinished):
                send_in_background(crashed.urls["get"], event)
                wait_running(docker_host, run_of(event))
            kill(crashed)
        finally:
            crashed.stop()
        wait_until(
            lambda: status(docker_host, run_of(unfinished)) == "exited", "the script's exit", 60
        )
        others = finished_leftover(other_env, other / "first.log", docker_host)
        finished = finished_leftover(env, tmp_path / "first.log", docker_host)
        made += [others, finished]
        services = get_service(env, tmp_path / "next.log")
        try:
            sweep = swept(docker_host, finished, tmp_path / "next.log")
        finally:
            services.stop()
        assert sweep["removed"] == 1
        assert status(docker_host, run_of(running)) == "running"
        assert status(docker_host, run_of(unfinished)) == "exited"  # a redelivery adopts it
        assert status(docker_host, others) == "exited"  # its result is in the other store
        assert (other / f"rf-{others}").exists()
    finally:
        remove_containers(docker_host, made)
