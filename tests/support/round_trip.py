"""The get → put round trip through the real services, as the end-to-end and cluster tiers
run it (each adds what it alone can see of the runs: a service's run counter, the cluster's
Jobs and pods):

    get_new_version(urls, source, prefix) -> Fetched
        the test type's get of a version no get has fetched (``<prefix>-<random>``)
    put_fetched(urls, source, fetched)
        a put given that artifact (URL and digest): the test type's ``out`` answers
        ``pushed-<ref>`` and lists the files it was given (``PUT_FILES``)
    put_across_teams(urls, source, observe) -> TeamPuts
        team a's get; team b's put of its artifact refused 403 before anything runs, team a's
        answered; ``observe`` (the runs a tier counts) read around the two puts
    succeeded(urls, action, data), put_input(artifact)
        a reply that must be a 200 ``….succeeded`` (its data); an artifact as a put's input:
        the fidelity round trips' (rootfs, git links) on both tiers
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cloudevents.core.v1.event import CloudEvent

from tests.support.events import request_event, send

T = TypeVar("T")
# What the test type's get writes (tests/support/images/test-resource/in), as its put lists it.
PUT_FILES = ["./sub/build.txt", "./sub/run.sh", "./version"]


def succeeded(
    urls: Mapping[str, str], action: str, data: dict[str, Any], *, timeout: float = 120
) -> dict[str, Any]:
    """The data of ``action``'s reply to ``data``, which must be answered 200 and succeed."""
    status, reply, response = send(urls[action], request_event(action, data), timeout=timeout)
    assert status == 200, response.text
    assert reply.get_type().endswith(".succeeded"), reply.get_data()
    return reply.get_data()


def put_input(artifact: Mapping[str, Any]) -> dict[str, str]:
    """A get's artifact as a put's input: its URL and the digest it must have."""
    return {"url": artifact["url"], "digest": artifact["digest"]}


@dataclass(frozen=True)
class Fetched:
    ref: str  # the version got: {"ref": ref}
    reply: CloudEvent

    @property
    def artifact(self) -> dict[str, Any]:
        return self.reply.get_data()["artifact"]


def get_new_version(
    urls: Mapping[str, str], source: dict[str, Any], prefix: str, team: str | None = None
) -> Fetched:
    """The test type's get of ``{"ref": "<prefix>-<random>"}`` (for ``team``, if given),
    answered 200 and succeeded."""
    ref = f"{prefix}-{uuid.uuid4().hex[:8]}"
    data: dict[str, Any] = {"type": "test", "source": source, "version": {"ref": ref}}
    if team is not None:
        data["build"] = {"team": team}
    status, got, response = send(urls["get"], request_event("get", data))
    assert status == 200, response.text
    assert got.get_type().endswith("succeeded"), got.get_data()
    return Fetched(ref, got)


def put_request(source: dict[str, Any], given: str | dict[str, str]) -> dict[str, Any]:
    """The test type's put of one input, ``repo`` (``given``: its URL, or ``put_input``)."""
    return {
        "type": "test",
        "source": source,
        "params": {"input": "repo"},
        "inputs": {"repo": given},
    }


def put_fetched(urls: Mapping[str, str], source: dict[str, Any], fetched: Fetched) -> CloudEvent:
    """A put given ``fetched``'s artifact: answered 200, succeeded, ``pushed-<ref>`` with the
    files the get wrote in its metadata. Its reply."""
    data = {**put_request(source, put_input(fetched.artifact)), "build": {"id": "78"}}
    status, reply, _ = send(urls["put"], request_event("put", data))
    assert status == 200
    assert reply.get_type() == "dev.resourcefunctions.put.succeeded", reply.get_data()
    assert reply.get_data()["version"] == {"ref": f"pushed-{fetched.ref}"}
    assert reply.get_data()["metadata"][0]["value"].split() == PUT_FILES
    return reply


@dataclass(frozen=True)
class TeamPuts(Generic[T]):
    """What ``observe`` gave before team b's put, after its refusal and after team a's put."""

    before: T
    after_refusal: T
    after: T


def put_across_teams(
    urls: Mapping[str, str], source: dict[str, Any], observe: Callable[[], T]
) -> TeamPuts[T]:
    """Team a's get; team b's put of its artifact, refused 403 ``input_not_allowed`` naming
    the input; team a's put of it, answered 200 and succeeded with its team attribute."""
    fetched = get_new_version(urls, source, "t", team="a")
    assert fetched.reply.get_extension("team") == "a"
    put = put_request(source, fetched.artifact["url"])
    before = observe()

    _, _, refused = send(urls["put"], request_event("put", {**put, "build": {"team": "b"}}))
    after_refusal = observe()
    status, reply, answered = send(
        urls["put"], request_event("put", {**put, "build": {"team": "a"}})
    )

    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["kind"] == "input_not_allowed"
    assert "'repo'" in refused.json()["error"]["message"]
    assert status == 200, answered.text
    assert reply.get_type() == "dev.resourcefunctions.put.succeeded", reply.get_data()
    assert reply.get_extension("team") == "a"
    return TeamPuts(before, after_refusal, observe())
