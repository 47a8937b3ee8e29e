"""Warm check containers (docs/warm-checks.md): one container per team, image and container
settings serves many sources, each in a directory of its own (its HOME and TMPDIR, made by
rf-agent), one check at a time per source. Real check service under gunicorn, real Podman;
the warm resource counts its source's checks in $TMPDIR and what it left in $HOME."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from typing import Any

import docker
import pytest

from testbed.event_sink import event_sink
from tests.support.engine import service_env
from tests.support.events import request_event, send
from tests.support.images import build_warm_resource
from tests.support.parallel import parallel
from tests.support.services import Services, start_services

PASSWORD = "warm-secret-5e1f"


@pytest.fixture(scope="module")
def warm_image():
    return build_warm_resource()


@pytest.fixture
def check_service(docker_host, warm_image, tmp_path):
    env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "on"}
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    yield services
    services.stop()


def check(
    services: Services,
    source: dict[str, Any],
    team: str = "",
    version: Any = None,
    type: str = "test",
) -> dict[str, Any]:
    """One check; its only version (count, seen, container, home, tmp) or its failure."""
    data: dict[str, Any] = {"type": type, "source": source}
    if team:
        data["build"] = {"team": team}
    if version is not None:
        data["version"] = version
    status, reply, response = send(services.urls["check"], request_event("check", data))
    assert status == 200, response.text
    answer = reply.get_data()
    return answer.get("error") or answer["versions"][-1]


def warm_containers(docker_host: str) -> list[Any]:
    client = docker.DockerClient(base_url=docker_host)
    return client.containers.list(all=True, filters={"label": "warm-check"})


def new_source(**more: Any) -> dict[str, Any]:
    return {"nonce": uuid.uuid4().hex, "password": PASSWORD, **more}


def test_the_second_check_of_a_source_finds_what_its_first_left(check_service, docker_host):
    source = new_source()
    first = check(check_service, source)
    second = check(check_service, source)
    assert (first["count"], first["seen"]) == ("1", "1")
    assert (second["count"], second["seen"]) == ("2", "2")  # its $TMPDIR and $HOME kept
    assert second["container"] == first["container"]
    assert check_service.metric("check", "resource_function_warm_reuses_total") == 1
    assert check_service.metric("check", "resource_function_warm_starts_total") == 1
    assert check_service.metric("check", "resource_function_warm_containers") == 1
    assert PASSWORD not in check_service.log_path.read_text()
    labels = warm_containers(docker_host)[0].labels
    assert PASSWORD not in str(labels) and source["nonce"] not in str(labels)


def test_sources_of_a_team_and_image_share_a_container_never_a_directory(check_service):
    sources = [new_source() for _ in range(3)]
    answers = [check(check_service, s) for s in sources] + [check(check_service, sources[0])]
    assert len({a["container"] for a in answers}) == 1  # one container for the three
    assert [(a["count"], a["seen"]) for a in answers] == [("1", "1")] * 3 + [("2", "2")]
    homes = {a["home"] for a in answers[:3]}
    tmps = {a["tmp"] for a in answers[:3]}
    assert len(homes) == len(tmps) == 3  # each source its own
    for answer in answers:
        assert re.fullmatch(r"/tmp/rf-sources/[0-9a-f]{32}/home", answer["home"])
        assert answer["tmp"] == answer["home"].replace("/home", "/tmp")
        assert PASSWORD not in answer["home"]
    assert check_service.metric("check", "resource_function_warm_starts_total") == 1
    assert check_service.metric("check", "resource_function_warm_sources") == 3


def test_two_teams_or_two_container_settings_never_share_a_container(
    docker_host, warm_image, tmp_path
):
    """Another team's check of the same source, and a type of the same image whose container
    settings differ (privileged), get containers of their own (two images: the moved tag's
    test below)."""
    env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "on"}
    types = json.loads(env["RESOURCE_TYPES"])
    types["privileged"] = {"image": warm_image, "privileged": True}
    env["RESOURCE_TYPES"] = json.dumps(types)
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    try:
        source = new_source()
        mine = check(services, source, team="a")
        theirs = check(services, source, team="b")
        privileged = check(services, source, team="a", type="privileged")
        again = check(services, source, team="a")
        containers = {mine["container"], theirs["container"], privileged["container"]}
        assert len(containers) == 3
        assert theirs["count"] == privileged["count"] == "1"
        assert (again["count"], again["container"]) == ("2", mine["container"])
    finally:
        services.stop()


def test_a_removed_warm_container_is_replaced_without_a_failure(check_service, docker_host):
    source = new_source()
    first = check(check_service, source)
    for container in warm_containers(docker_host):
        container.remove(force=True)
    second = check(check_service, source)
    assert second["count"] == "1" and second["container"] != first["container"]
    dead = check_service.metric("check", "resource_function_warm_evictions_total", reason="dead")
    assert dead == 1


def test_a_second_check_of_a_busy_source_runs_in_a_new_container(docker_host, warm_image, tmp_path):
    env = {
        **service_env(docker_host, warm_image, tmp_path),
        "WARM_CHECKS": "on",
        "CHECK_LEASE_SECONDS": "0",  # no lease: two checks of one resource may run at once
    }
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    try:
        source = new_source(delay=2)
        warm = check(services, source)["container"]
        # Two versions: two flights of one source.
        both = parallel(lambda i: check(services, source, version={"count": str(i)}), 2)
        assert sorted(answer["count"] for answer in both) == ["1", "2"]
        reused = next(answer for answer in both if answer["count"] == "2")
        other = next(answer for answer in both if answer["count"] == "1")
        assert reused["container"] == warm and other["container"] != warm
        assert [c.id[:12] for c in warm_containers(docker_host)] == [warm]  # the other went
    finally:
        services.stop()


def test_a_check_over_its_budget_ends_alone(check_service, docker_host):
    """Its processes go (the child it left too); the container stays, with another source's
    directory, which its next check finds."""
    other = new_source()
    assert check(check_service, other)["count"] == "1"
    status, reply, response = send(
        check_service.urls["check"],
        request_event("check", {"type": "slow", "source": new_source(mode="hang")}),
    )
    assert status == 200, response.text
    assert reply.get_data()["error"]["kind"] == "timeout"
    assert not sleeping_checks()  # the check's child went with it
    after = check(check_service, other)
    assert after["count"] == "2"  # the same container, its directory kept
    assert len(warm_containers(docker_host)) == 1
    assert check_service.metric("check", "resource_function_warm_starts_total") == 1


def test_sigterm_leaves_no_warm_container(docker_host, warm_image, tmp_path):
    env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "on"}
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    try:
        check(services, new_source(), team="a")
        check(services, new_source(), team="b")
        assert len(warm_containers(docker_host)) == 2
    finally:
        services.stop()  # SIGTERM: the drain removes them
    assert warm_containers(docker_host) == []


def test_the_next_start_sweeps_a_killed_service_warm_containers(docker_host, warm_image, tmp_path):
    env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "on"}
    first = start_services(env, tmp_path / "first.log", actions=("check",))
    try:
        check(first, new_source())
        for proc in first.procs:
            for pid in [*children(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.wait(10)
        assert len(warm_containers(docker_host)) == 1  # left behind
    finally:
        first.stop()
    second = start_services(env, tmp_path / "second.log", actions=("check",))
    try:
        assert warm_containers(docker_host) == []  # swept before it serves
    finally:
        second.stop()


def test_an_async_warm_checks_reply_is_posted_before_its_202(docker_host, warm_image, tmp_path):
    """A warm check runs in its request even with an asynchronous reply: the service killed
    the moment it answers 202 has posted the reply already (nothing would post it later:
    no redelivery comes after a 202). Its first check starts the container, seconds in which
    a reply left to the background would be lost."""
    with event_sink() as sink:
        env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "on"}
        services = start_services({**env, "K_SINK": sink.url}, tmp_path / "s.log", ("check",))
        try:
            data = {"type": "test", "source": new_source()}
            event = request_event("check", data, replymode="async")
            status, _, response = send(services.urls["check"], event)
            for proc in services.procs:
                for pid in [*children(proc.pid), proc.pid]:
                    os.kill(pid, signal.SIGKILL)
                proc.wait(10)
            replies = sink.drain()
        finally:
            services.stop()
            for container in warm_containers(docker_host):
                container.remove(force=True)
    assert status == 202, response.text
    ends = [e for e in replies if e.get_type() == "dev.resourcefunctions.check.succeeded"]
    assert [e.get_extension("requestid") for e in ends] == [event.get_id()]
    assert ends[0].get_data()["versions"][-1]["count"] == "1"


def test_the_switch_turns_reuse_off(docker_host, warm_image, tmp_path):
    env = {**service_env(docker_host, warm_image, tmp_path), "WARM_CHECKS": "off"}
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    try:
        source = new_source()
        assert check(services, source)["count"] == "1"
        assert check(services, source)["count"] == "1"
        assert warm_containers(docker_host) == []
    finally:
        services.stop()


def test_a_warm_container_that_cannot_start_leaves_the_check_to_a_new_one(
    docker_host, warm_image, tmp_path
):
    """The engine refuses the warm container (its pause program is not there to mount): the
    check runs in a new container, as without reuse, and succeeds; nothing is left warm."""
    env = {
        **service_env(docker_host, warm_image, tmp_path),
        "WARM_CHECKS": "on",
        "WARM_CHECK_PAUSE": str(tmp_path / "no-such-pause"),
    }
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    try:
        source = new_source()
        assert check(services, source)["count"] == "1"
        assert check(services, source)["count"] == "1"  # a new container each time
        assert warm_containers(docker_host) == []
    finally:
        services.stop()
    assert (
        "no warm check container, the check runs in a new one"
        in (tmp_path / "services.log").read_text()
    )


def test_a_moved_tag_gets_a_new_warm_container_after_the_image_seconds(
    docker_host, warm_image, tmp_path
):
    """The image's id is remembered for WARM_CHECK_IMAGE_SECONDS (no inspect per check); a
    tag moved to another image is then seen, and its checks get a container of their own."""
    client = docker.DockerClient(base_url=docker_host)
    repository, version = "localhost/rf-warm-moved", uuid.uuid4().hex[:8]
    tag = f"{repository}:{version}"
    client.images.get(warm_image).tag(repository, version)
    base = client.containers.create(warm_image, command=["/bin/true"])
    moved = base.commit(conf={"Labels": {"rf-variant": "moved"}})  # the same files, a new id
    base.remove()
    env = {**service_env(docker_host, tag, tmp_path), "WARM_CHECKS": "on"}
    services = start_services(
        {**env, "WARM_CHECK_IMAGE_SECONDS": "3"}, tmp_path / "services.log", actions=("check",)
    )
    try:
        source = new_source()
        first = check(services, source)
        moved.tag(repository, version)
        time.sleep(3.5)
        after = check(services, source)
        assert first["count"] == "1"
        assert after["count"] == "1" and after["container"] != first["container"]
        assert {c.image.id for c in warm_containers(docker_host)} >= {moved.id}
    finally:
        services.stop()
        client.images.remove(moved.id, force=True)  # and the tag, which is on it by now


def children(pid: int) -> list[int]:
    return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def sleeping_checks() -> list[str]:
    found = subprocess.run(
        ["pgrep", "-af", "sleep 3141"], capture_output=True, text=True, check=False
    )
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]
