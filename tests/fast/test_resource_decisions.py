"""Resources (issue 51) as data: their slots spread over the interval, one request id per
slot, what a look at one posts and writes, and what a reply to its check writes
(functions/resources/schedule.py, decisions.py)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.model import ResourceType
from functions.resources import schedule
from functions.resources.decisions import (
    ABANDON_SECONDS,
    API_VERSION,
    REPOST_FIRST,
    Context,
    condition_of,
    decide,
    on_reply,
    parse_subject,
    subject,
)
from functions.tekton import status as st
from functions.tekton.decide import Reply

IMAGE = "registry.test/git@sha256:" + "a" * 64
SECRET = "hunter2-literal-password"
NOW = datetime(2026, 12, 5, 12, 0, 7, tzinfo=UTC)
CTX = Context(
    event_source="/resource-functions/tekton-controller",
    team_of=lambda namespace: {"ci-main": "main", "ci-blue": "blue"}.get(namespace),
    resource_types={"git": ResourceType(image=IMAGE)},
    refusal=lambda namespace: f"namespace {namespace!r} carries no team label",
)


def resource(name: str = "repo", namespace: str = "ci-main", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Resource",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": {
            "type": "git",
            "source": {"uri": "https://git.test/repo.git", "password": SECRET},
            "checkEvery": "1m",
            **spec,
        },
    }


def never(_request: str) -> bool:
    return False


def always(_request: str) -> bool:
    return True


def with_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "status": status}


def reply(request: str, succeeded: bool = True, **data: Any) -> Reply:
    return Reply(request, succeeded, data, "check", "/resource-functions/check", "main")


# --- the schedule ----------------------------------------------------------------------------


def test_a_thousand_resources_of_one_interval_are_spread_over_it() -> None:
    """Each resource's offset is a hash of its uid: the busiest second of a minute holds a
    small multiple of the mean (16.7 a second), where PingSources on one schedule all fire in
    the same second."""
    offsets = Counter(schedule.offset_of(str(uuid.uuid4()), 60) for _ in range(1000))
    assert set(offsets) <= set(range(60))
    assert max(offsets.values()) <= 3 * 1000 / 60, offsets.most_common(3)
    assert len(offsets) == 60  # every second of the minute has some


def test_a_slot_starts_at_the_resources_offset_and_holds_now() -> None:
    for now in (0.0, 59.9, 60.0, 1_765_000_007.5):
        for interval, offset in ((60, 0), (60, 37), (10, 9), (3600, 1234)):
            start = schedule.slot_start(now, interval, offset)
            assert start <= now < start + interval
            assert start % interval == offset % interval


def test_a_slots_request_id_is_the_same_for_every_claim_and_new_for_the_next_slot() -> None:
    first = schedule.request_id("uid-a", 1_765_000_020)
    assert first == schedule.request_id("uid-a", 1_765_000_020)
    assert first != schedule.request_id("uid-a", 1_765_000_080)
    assert first != schedule.request_id("uid-b", 1_765_000_020)
    assert uuid.UUID(first).version == 5


def test_a_replys_subject_names_a_resource_and_nothing_else() -> None:
    assert parse_subject(subject("ci-main", "repo")) == ("ci-main", "repo")
    assert parse_subject("tekton.dev/customruns/ci-main/repo") is None
    assert parse_subject(subject("ci-main", "a/b")) is None
    assert parse_subject(subject("", "repo")) is None


# --- a look ----------------------------------------------------------------------------------


def claimed(step: Any) -> dict[str, Any]:
    assert step.status is not None and step.post is not None
    return step.status


def test_a_due_resource_is_claimed_in_its_status_then_posted_for_its_team() -> None:
    obj = resource()
    step = decide(obj, NOW, CTX, never)
    status = claimed(step)
    interval, offset = 60, schedule.offset_of("uid-repo", 60)
    slot = schedule.slot_start(NOW.timestamp(), interval, offset)
    check = status["check"]
    assert check["requestId"] == schedule.request_id("uid-repo", slot) == step.post.request_id
    assert st.parse_time(check["slot"]).timestamp() == slot
    assert (check["team"], check["posts"], "version" in check) == ("main", 1, False)
    attributes, data = step.post.attributes, step.post.data
    assert attributes["subject"] == "resource-functions.dev/resources/ci-main/repo"
    assert (attributes["type"], attributes["team"]) == (
        "dev.resourcefunctions.check.requested",
        "main",
    )
    assert data["source"]["password"] == SECRET  # the functions need it; never the status
    assert data["build"]["team"] == "main" and "version" not in data
    assert step.wake_at is not None and step.wake_at <= NOW + timedelta(seconds=REPOST_FIRST)


def test_the_next_check_goes_from_the_latest_version() -> None:
    status = {"latestVersion": {"ref": "abc"}, "versionsSeen": 3}
    step = decide(with_status(resource(), status), NOW, CTX, never)
    assert step.post is not None and step.post.data["version"] == {"ref": "abc"}
    assert claimed(step)["check"]["version"] == {"ref": "abc"}


def test_an_answered_slot_is_not_posted_again_until_the_next_one() -> None:
    first = claimed(decide(resource(), NOW, CTX, never))
    rid = first["check"]["requestId"]
    answered = with_status(resource(), {**first, "answered": rid})
    later = NOW + timedelta(seconds=5)
    step = decide(answered, later, CTX, always)
    assert step.post is None
    slot_end = st.parse_time(first["check"]["slot"]) + timedelta(seconds=60)
    assert step.wake_at == slot_end
    following = decide(answered, slot_end, CTX, always)
    assert following.post is not None and following.post.request_id != rid


def test_a_check_still_out_is_posted_again_under_its_id_on_a_growing_schedule() -> None:
    first = claimed(decide(resource(), NOW, CTX, never))
    rid = first["check"]["requestId"]
    out = with_status(resource(), first)
    assert decide(out, NOW + timedelta(seconds=30), CTX, always).post is None  # not due yet
    again = decide(out, NOW + timedelta(seconds=REPOST_FIRST), CTX, always)
    assert again.post is not None and again.post.request_id == rid
    assert again.status is not None and again.status["check"]["posts"] == 2
    # A slot of its own is never claimed while it is out: the next minute holds no new id.
    next_minute = decide(out, NOW + timedelta(seconds=61), CTX, always)
    assert next_minute.post is None or next_minute.post.request_id == rid


def test_a_claim_another_process_made_is_posted_again_at_once_under_the_same_id() -> None:
    """A leader that wrote the claim and died before its post (or a new leader): the claim
    is posted again, not a second check for the slot; the functions run one id once."""
    first = claimed(decide(resource(), NOW, CTX, never))
    step = decide(with_status(resource(), first), NOW + timedelta(seconds=2), CTX, never)
    assert step.post is not None and step.post.request_id == first["check"]["requestId"]


def test_a_check_without_reply_is_given_up_and_the_next_slot_claimed() -> None:
    first = claimed(decide(resource(), NOW, CTX, never))
    late = NOW + timedelta(seconds=ABANDON_SECONDS + 60)
    step = decide(with_status(resource(), first), late, CTX, always)
    assert step.post is not None and step.post.request_id != first["check"]["requestId"]
    assert step.status is not None
    condition = condition_of(step.status) or {}
    assert (condition["status"], condition["reason"]) == ("Unknown", "NoReply")


def test_a_paused_resource_is_neither_posted_nor_changed() -> None:
    step = decide(
        with_status(resource(paused=True), {"latestVersion": {"ref": "1"}}), NOW, CTX, never
    )
    assert (step.status, step.post, step.wake_at) == (None, None, None)


def test_a_namespace_without_a_team_is_refused_in_the_status() -> None:
    step = decide(resource(namespace="elsewhere"), NOW, CTX, never)
    assert step.post is None and step.status is not None
    condition = condition_of(step.status) or {}
    assert (condition["status"], condition["reason"]) == ("False", "NoTeam")
    assert "carries no team label" in condition["message"]
    assert step.wake_at is not None  # a label may come


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"type": "svn"}, "svn"),
        ({"checkEvery": "soon"}, "checkEvery"),
        ({"checkEvery": "1s"}, "between 10s"),
        ({"image": "registry.test/x:1"}, "type"),  # both type and image
        ({"source": {"k": "x" * 70_000}}, "more than"),
    ],
)
def test_a_spec_the_functions_would_refuse_is_said_and_not_posted(
    spec: dict[str, Any], said: str
) -> None:
    step = decide(resource(**spec), NOW, CTX, never)
    assert step.post is None and step.status is not None
    condition = condition_of(step.status) or {}
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert said in condition["message"]
    assert SECRET not in json.dumps(step.status)


# --- a reply ---------------------------------------------------------------------------------


def out_now() -> tuple[dict[str, Any], str]:
    first = claimed(decide(resource(), NOW, CTX, never))
    return with_status(resource(), first), first["check"]["requestId"]


def test_a_reply_sets_the_latest_version_and_counts_the_new_ones() -> None:
    obj, rid = out_now()
    later = NOW + timedelta(seconds=3)
    step = on_reply(obj, reply(rid, versions=[{"ref": "1"}, {"ref": "2"}]), later)
    status = step.status
    assert status is not None
    assert (status["latestVersion"], status["latest"], status["versionsSeen"]) == (
        {"ref": "2"},
        "ref=2",
        2,
    )
    assert status["lastChecked"] == st.timestamp(later) and status["answered"] == rid
    condition = condition_of(status) or {}
    assert (condition["status"], condition["reason"]) == ("True", "Succeeded")
    # The next check, from version 2, finds 2 and 3: one new.
    after = claimed(
        decide(with_status(resource(), status), NOW + timedelta(seconds=60), CTX, never)
    )
    second = on_reply(
        with_status(resource(), after),
        reply(after["check"]["requestId"], versions=[{"ref": "2"}, {"ref": "3"}]),
        later,
    ).status
    assert second is not None and (second["versionsSeen"], second["latest"]) == (3, "ref=3")
    assert SECRET not in json.dumps(second)


def test_a_failed_check_says_its_kind_and_the_functions_redacted_log_tail() -> None:
    obj, rid = out_now()
    error = {"kind": "resource_failed", "message": "check failed", "exit_code": 128}
    error["log_tail"] = "fatal: could not read Password for [redacted]"
    status = on_reply(obj, reply(rid, False, error=error), NOW).status
    assert status is not None
    condition = condition_of(status) or {}
    assert (condition["status"], condition["reason"]) == ("False", "ResourceFailed")
    assert "could not read Password for [redacted]" in condition["message"]
    assert "latestVersion" not in status and SECRET not in json.dumps(status)


def test_only_the_claimed_checks_reply_from_the_check_function_of_its_team_is_taken() -> None:
    obj, rid = out_now()
    assert on_reply(obj, reply(str(uuid.uuid4()), versions=[{"ref": "9"}]), NOW).status is None
    forged = Reply(rid, True, {"versions": [{"ref": "9"}]}, "check", "/somewhere", "main")
    assert "no check's" in on_reply(obj, forged, NOW).dropped
    other = Reply(
        rid, True, {"versions": [{"ref": "9"}]}, "check", "/resource-functions/check", "blue"
    )
    assert "not the check's team" in on_reply(obj, other, NOW).dropped
    taken = on_reply(obj, reply(rid, versions=[{"ref": "1"}]), NOW).status
    assert taken is not None
    again = on_reply(with_status(resource(), taken), reply(rid, versions=[{"ref": "1"}]), NOW)
    assert again.status is None  # a redelivered reply changes nothing
