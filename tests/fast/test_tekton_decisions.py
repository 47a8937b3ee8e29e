"""The Tekton Custom Task's decisions, as pure functions (functions/tekton/params, status,
decide, receiver.reply_of): a CustomRun and the time in, the status to write, the request
to post and the Job to stop out."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.model import ResourceType
from functions.setting_values import tekton_teams
from functions.tekton import status as st
from functions.tekton.controller_config import ControllerConfig
from functions.tekton.decide import (
    Context,
    Reply,
    Step,
    decide,
    on_reply,
    parse_duration,
    parse_subject,
    subject,
)
from functions.tekton.receiver import reply_of
from tests.support.tekton_pipelines import custom_run

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
UID = "0f6a3c1e-9d1b-4d1e-a3b2-5a6c7d8e9f00"
STORE = "s3://bucket/ci"
CTX = Context(
    event_source="/resource-functions/tekton-controller",
    team_of=lambda ns: {"team-a": "main"}.get(ns),
    resource_types={"git": ResourceType(image="registry.test/git@sha256:" + "a" * 64)},
    artifact_url_prefix=STORE + "/artifacts/",
    new_id=lambda: f"req{next(_ids):029d}",
)
_ids = itertools.count()
ARTIFACT = {
    "url": STORE + "/artifacts/k.tar.zst",
    "digest": "sha256:" + "b" * 64,
    "size": 10,
    "format": "zstd",
}


def customrun(kind: str = "Get", *, params: dict[str, Any] | None = None, **spec: Any) -> dict:
    given = (
        {"type": "git", "source": '{"uri": "https://x"}', "version": '{"ref": "abc"}'}
        if params is None
        else params
    )
    run = custom_run("pr-1-fetch", "team-a", given, kind, **spec)
    run["metadata"] |= {
        "uid": UID,
        "ownerReferences": [
            {
                "apiVersion": "tekton.dev/v1",
                "kind": "PipelineRun",
                "name": "pr-1",
                "uid": "1",
                "controller": True,
            }
        ],
        "labels": {
            "tekton.dev/pipelineRun": "pr-1",
            "tekton.dev/pipelineTask": "fetch",
            "tekton.dev/pipeline": "build",
        },
    }
    return run


def with_status(run: dict, status: dict | None) -> dict:
    return {**run, "status": status or {}}


def current(run: dict) -> str:
    """The request id of the attempt under way."""
    return str(run["status"]["extraFields"]["requestId"])


def answer(run: dict, succeeded: bool, data: dict, **changes: Any) -> Reply:
    """The functions' reply to the attempt under way: its request id, the action of the run's
    kind, that function's source and the run's team (``changes`` forge any of them)."""
    action = run["spec"]["customRef"]["kind"].lower()
    given: dict[str, Any] = {
        "request_id": current(run),
        "succeeded": succeeded,
        "data": data,
        "action": action,
        "source": f"/resource-functions/{action}",
        "team": "main",
    }
    return Reply(**{**given, **changes})


def condition(status: dict) -> dict:
    found = st.condition_of(status)
    assert found is not None
    return found


# --- starting -------------------------------------------------------------------------------


def test_a_new_get_is_started_then_its_request_posted_with_a_new_random_id() -> None:
    step = decide(customrun(), T0, CTX)
    assert step.status is not None and step.post is not None
    assert condition(step.status)["status"] == "Unknown"
    assert step.status["startTime"] == "2026-12-03T12:00:00Z"
    rid = step.status["extraFields"]["requestId"]
    attributes = step.post.attributes
    assert attributes["id"] == rid != UID
    assert attributes["type"] == "dev.resourcefunctions.get.requested"
    assert attributes["subject"] == "tekton.dev/customruns/team-a/pr-1-fetch"
    assert attributes["team"] == "main"
    assert step.post.data == {
        "type": "git",
        "source": {"uri": "https://x"},
        "version": {"ref": "abc"},
        "build": {
            "id": UID,
            "name": "pr-1",
            "job": "fetch",
            "pipeline": "build",
            "team": "main",
        },
    }
    assert step.wake_at == T0 + timedelta(minutes=60)
    assert step.stop is None


def test_the_default_request_ids_are_random_and_never_the_uid() -> None:
    ids = {Context(event_source="s", team_of=lambda ns: ns).new_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)


def test_a_running_run_is_reposted_with_the_same_id_as_after_a_restart() -> None:
    started = decide(customrun(), T0, CTX).status
    run = with_status(customrun(), started)
    step = decide(run, T0 + timedelta(minutes=5), CTX)
    assert step.status is None
    assert step.post is not None and step.post.request_id == current(run)
    assert step.wake_at == T0 + timedelta(minutes=60)


def test_runs_of_another_api_group_and_finished_runs_are_left_alone() -> None:
    other = customrun()
    other["spec"]["customRef"]["apiVersion"] = "example.dev/v1"
    assert decide(other, T0, CTX) == decide(other, T0, CTX).__class__()
    done = st.finished({}, True, st.SUCCEEDED, "ok", T0)
    assert decide(with_status(customrun(), done), T0, CTX).status is None
    cancelled_after = with_status(customrun(status="RunCancelled"), done)
    assert decide(cancelled_after, T0, CTX).status is None


@pytest.mark.parametrize(
    ("kind", "params", "named"),
    [
        ("Get", {"type": "git", "source": "{not json", "version": "{}"}, "'source'"),
        ("Get", {"type": "git", "source": "{}"}, "'version'"),
        ("Get", {"type": "nope", "source": "{}", "version": "{}"}, "type 'nope'"),
        ("Get", {"source": "{}", "version": "{}"}, "'type'"),
        ("Get", {"type": "git", "version": '{"ref": 1}'}, "'version'"),
        ("Check", {"type": "git", "params": "{}"}, "params"),
        ("Get", {"type": "git", "version": "{}", "team": "other"}, "team"),
        ("Put", {"type": "git", "inputs": '{"repo": "s3://elsewhere/x.tar.zst"}'}, "input 'repo'"),
        ("Put", {"type": "git", "inputs": "[]"}, "'inputs'"),
        ("Deploy", {"type": "git"}, "kind 'Deploy'"),
    ],
)
def test_bad_params_fail_the_run_naming_the_param_and_post_nothing(
    kind: str, params: dict[str, str], named: str
) -> None:
    step = decide(customrun(kind, params=params), T0, CTX)
    assert step.post is None
    assert step.status is not None
    found = condition(step.status)
    assert (found["status"], found["reason"]) == ("False", st.BAD_PARAMS)
    assert named in found["message"], found["message"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
        ('{"a": ' * 65 + "1" + "}" * 65, "nested deeper than 64 levels"),
        ('"' + "x" * (300 * 1024) + '"', "more than 262144"),
    ],
    ids=["5000-deep", "65-deep", "300-KiB"],
)
def test_a_param_too_deep_or_too_large_is_refused_before_it_is_parsed(
    value: str, said: str
) -> None:
    """A param 5,000 levels deep raised RecursionError out of the controller's loop, for
    every namespace: it is judged as text first, and the run alone ends."""
    params = {"type": "git", "source": value, "version": '{"ref": "abc"}'}
    step = decide(customrun(params=params), T0, CTX)
    assert step.post is None and step.status is not None
    found = condition(step.status)
    assert (found["reason"], found["status"]) == (st.BAD_PARAMS, "False")
    assert "'source'" in found["message"] and said in found["message"]


def test_params_too_large_together_are_refused() -> None:
    big = '"' + "x" * (200 * 1024) + '"'
    params = {"type": "git", "source": big, "version": big, "params": big}
    params |= {"image": "x" * (1500 * 1024)}
    found = condition(decide(customrun(params=params), T0, CTX).status or {})
    assert found["reason"] == st.BAD_PARAMS and "bytes of text" in found["message"]


@pytest.mark.parametrize("retries", ["x", -1, 1.5, True])
def test_retries_that_are_no_whole_number_fail_the_run(retries: object) -> None:
    step = decide(customrun(retries=retries), T0, CTX)
    assert step.post is None
    assert "spec.retries" in condition(step.status or {})["message"]


def test_a_namespace_without_a_team_is_not_served() -> None:
    run = customrun()
    run["metadata"]["namespace"] = "stranger"
    step = decide(run, T0, CTX)
    assert step.post is None and step.status is not None
    assert "'stranger'" in condition(step.status)["message"]


def test_a_put_takes_a_gets_artifact_result_as_an_input() -> None:
    params = {"type": "git", "source": "{}", "inputs": json.dumps({"repo": ARTIFACT})}
    step = decide(customrun("Put", params=params), T0, CTX)
    assert step.post is not None
    assert step.post.data["inputs"] == {
        "repo": {"url": ARTIFACT["url"], "digest": ARTIFACT["digest"]}
    }
    assert step.post.attributes["type"] == "dev.resourcefunctions.put.requested"


# --- replies --------------------------------------------------------------------------------


def running(run: dict | None = None) -> dict:
    run = run or customrun()
    return with_status(run, decide(run, T0, CTX).status)


def test_a_succeeded_get_writes_results_as_json_text_with_true() -> None:
    data = {
        "version": {"ref": "abc"},
        "metadata": [{"name": "a", "value": "b"}],
        "artifact": ARTIFACT,
    }
    run = running()
    step = on_reply(run, answer(run, True, data), T0 + timedelta(seconds=9), CTX)
    assert step.status is not None and step.post is None
    assert condition(step.status)["status"] == "True"
    assert step.status["completionTime"] == "2026-12-03T12:00:09Z"
    results = {r["name"]: r["value"] for r in step.status["results"]}
    assert json.loads(results["version"]) == {"ref": "abc"}
    assert json.loads(results["metadata"]) == [{"name": "a", "value": "b"}]
    assert json.loads(results["artifact"]) == ARTIFACT


def test_a_check_result_is_its_versions() -> None:
    run = running(customrun("Check", params={"type": "git", "source": "{}"}))
    data = {"versions": [{"ref": "1"}, {"ref": "2"}]}
    step = on_reply(run, answer(run, True, data), T0, CTX)
    assert step.status is not None
    results = {r["name"]: r["value"] for r in step.status["results"]}
    assert json.loads(results["versions"]) == [{"ref": "1"}, {"ref": "2"}]
    assert "2 version(s)" in condition(step.status)["message"]


def test_a_failed_get_is_false_with_its_kind_and_log_tail() -> None:
    error = {
        "kind": "resource_failed",
        "message": "in exited 1",
        "exit_code": 1,
        "log_tail": "fatal: no such ref\n",
    }
    run = running()
    step = on_reply(run, answer(run, False, {"error": error}), T0, CTX)
    assert step.status is not None
    found = condition(step.status)
    assert (found["status"], found["reason"]) == ("False", "ResourceFailed")
    assert "resource_failed" in found["message"] and "fatal: no such ref" in found["message"]
    assert "exit code 1" in found["message"]


def test_a_long_log_tail_keeps_its_end() -> None:
    error = {"kind": "resource_failed", "message": "x", "log_tail": "a" * 10000 + "THE END"}
    run = running()
    found = condition(on_reply(run, answer(run, False, {"error": error}), T0, CTX).status or {})
    assert found["message"].endswith("THE END") and len(found["message"]) <= st.MAX_MESSAGE


def test_a_reply_to_another_attempt_or_a_finished_run_is_dropped() -> None:
    run = running()
    assert on_reply(run, answer(run, True, {}, request_id=UID), T0, CTX).status is None
    done = with_status(customrun(), {**st.finished({}, False, st.CANCELLED, "x", T0)})
    done["status"]["extraFields"] = {"requestId": current(run)}
    assert on_reply(done, answer(done, True, {}), T0, CTX).status is None


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ({"team": "other"}, "team 'other'"),
        ({"team": ""}, "team ''"),
        ({"source": "/resource-functions/check"}, "source"),
        ({"source": "/intruder"}, "source"),
        ({"action": "check"}, "'check'"),
    ],
    ids=["another-team", "no-team", "another-function", "another-source", "a-check-reply"],
)
def test_a_reply_with_the_right_id_but_not_bound_to_the_run_changes_nothing(
    forged: dict[str, str], why: str
) -> None:
    run = running()
    data = {"version": {"ref": "evil"}, "metadata": [], "artifact": ARTIFACT}
    step = on_reply(run, answer(run, True, data, **forged), T0, CTX)
    assert step.status is None and step.post is None
    assert why in step.dropped
    assert on_reply(run, answer(run, True, data), T0, CTX).status is not None


def test_pipeline_labels_count_only_on_a_customrun_its_pipelinerun_made() -> None:
    bare = customrun()
    bare["metadata"]["ownerReferences"] = []
    step = decide(bare, T0, CTX)
    assert step.post is not None
    build = step.post.data["build"]
    assert (build["pipeline"], build["name"], build["job"]) == ("", "pr-1-fetch", "pr-1-fetch")
    owned = decide(customrun(), T0, CTX).post
    assert owned is not None and owned.data["build"]["pipeline"] == "build"


def test_a_failure_with_retries_left_starts_the_next_attempt_and_stays_unknown() -> None:
    run = running(customrun(retries=2))
    error = {"kind": "resource_failed", "message": "boom"}
    step = on_reply(run, answer(run, False, {"error": error}), T0 + timedelta(minutes=1), CTX)
    assert step.status is not None and step.post is not None
    assert condition(step.status)["status"] == "Unknown"
    assert condition(step.status)["reason"] == st.RETRYING
    assert step.post.request_id == step.status["extraFields"]["requestId"] != current(run)
    assert [condition(r)["status"] for r in step.status["retriesStatus"]] == ["False"]
    assert condition(step.status["retriesStatus"][0])["reason"] == "ResourceFailed"
    assert step.status["startTime"] == "2026-12-03T12:01:00Z"  # a new timeout window
    second = with_status(customrun(retries=2), step.status)
    step = on_reply(second, answer(second, False, {"error": error}), T0, CTX)
    assert step.status is not None and step.post is not None
    assert step.post.request_id not in (current(run), current(second))
    third = with_status(customrun(retries=2), step.status)
    step = on_reply(third, answer(third, False, {"error": error}), T0, CTX)
    assert step.status is not None and step.post is None
    assert condition(step.status)["status"] == "False"
    assert len(step.status["retriesStatus"]) == 2


# --- cancellation and timeouts ----------------------------------------------------------------


def stops(step: Step, run: dict) -> bool:
    """Whether ``step`` posts the stop of ``run``'s current attempt: its request's type, the
    run's team and subject, the attempt's request id under ``stops``; its own id derived."""
    stop = step.stop
    if stop is None:
        return False
    request = current(run)
    return (
        stop.attributes
        == {
            "specversion": "1.0",
            "type": "dev.resourcefunctions.get.requested",
            "source": CTX.event_source,
            "id": f"stop-{request}",
            "subject": subject(run["metadata"]["namespace"], run["metadata"]["name"]),
            "team": CTX.team_of(run["metadata"]["namespace"]),
            "stops": request,
        }
        and stop.data == {}
    )


def test_cancelling_a_running_run_stops_its_request_and_reports_customruncancelled() -> None:
    run = running()
    run["spec"]["status"] = "RunCancelled"
    run["spec"]["statusMessage"] = (
        "CustomRun cancelled as the PipelineRun it belongs to has been cancelled."
    )
    step = decide(run, T0 + timedelta(seconds=30), CTX)
    assert stops(step, run) and step.post is None and step.status is not None
    found = condition(step.status)
    assert (found["status"], found["reason"]) == ("False", "CustomRunCancelled")
    assert "PipelineRun it belongs to" in found["message"]


def test_a_run_cancelled_before_it_started_posts_nothing() -> None:
    step = decide(customrun(status="RunCancelled"), T0, CTX)
    assert step.post is None and step.stop is None
    assert condition(step.status or {})["reason"] == "CustomRunCancelled"


def test_an_attempt_past_its_timeout_is_timed_out_and_its_request_stopped() -> None:
    run = running(customrun(timeout="30s"))
    assert decide(run, T0 + timedelta(seconds=29), CTX).status is None
    step = decide(run, T0 + timedelta(seconds=30), CTX)
    assert stops(step, run) and step.post is None
    found = condition(step.status or {})
    assert (found["status"], found["reason"]) == ("False", "CustomRunTimedOut")


def test_a_timeout_with_retries_left_is_retried_with_a_new_window() -> None:
    run = running(customrun(timeout="1m30s", retries=1))
    step = decide(run, T0 + timedelta(seconds=90), CTX)
    assert stops(step, run)
    assert step.post is not None and step.post.request_id not in (UID, current(run))
    assert condition(step.status or {})["status"] == "Unknown"
    assert step.wake_at == T0 + timedelta(seconds=180)


def test_a_zero_timeout_never_times_out() -> None:
    run = running(customrun(timeout="0s"))
    step = decide(run, T0 + timedelta(days=30), CTX)
    assert step.status is None and step.wake_at is None


def test_a_bad_timeout_fails_the_run() -> None:
    step = decide(customrun(timeout="soon"), T0, CTX)
    assert step.post is None
    assert "spec.timeout" in condition(step.status or {})["message"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1h0m0s", 3600), ("90s", 90), ("0s", 0), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["1x", "h", "1h 2m", "-1s"])
def test_not_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


# --- the receiver's view of a reply, and configuration ---------------------------------------


def test_reply_events_are_read_from_their_type_subject_and_requestid() -> None:
    attributes = {
        "type": "dev.resourcefunctions.get.failed",
        "source": "/resource-functions/get",
        "subject": subject("team-a", "pr-1-fetch"),
        "requestid": UID,
        "team": "main",
    }
    assert reply_of(attributes, {"error": {}}) == (
        "CustomRun",
        "team-a",
        "pr-1-fetch",
        Reply(UID, False, {"error": {}}, "get", "/resource-functions/get", "main"),
    )
    assert reply_of({**attributes, "type": "dev.resourcefunctions.version.discovered"}, {}) is None
    assert reply_of({**attributes, "type": "dev.resourcefunctions.get.requested"}, {}) is None
    assert reply_of({**attributes, "subject": "something/else"}, {}) is None
    assert reply_of({k: v for k, v in attributes.items() if k != "requestid"}, {}) is None
    assert parse_subject(subject("a", "b")) == ("a", "b")
    assert parse_subject("tekton.dev/customruns/a/b/c") is None


def test_teams_are_mapped_by_tekton_teams() -> None:
    mapped = ControllerConfig(broker="http://b", store_url=STORE, teams=tekton_teams('{"ci": "x"}'))
    assert mapped.teams == {"ci": "x"}
    assert mapped.artifact_url_prefix == "s3://bucket/ci/artifacts/"


def test_the_controller_needs_the_broker_and_the_store_and_reads_teams() -> None:
    from functions.errors import ConfigError

    with pytest.raises(ConfigError, match="K_SINK"):
        ControllerConfig.from_env({"STORE_URL": STORE})
    with pytest.raises(ConfigError, match="TEKTON_TEAMS"):
        ControllerConfig.from_env({"STORE_URL": STORE, "K_SINK": "http://b", "TEKTON_TEAMS": "[1]"})
    env = {"STORE_URL": STORE, "K_SINK": "http://b", "SENDER_AUDIENCE": "resource-functions"}
    config = ControllerConfig.from_env(env)
    assert (config.broker, config.store_url, config.teams) == ("http://b", STORE, None)


def moved_to(team: str | None) -> Context:
    """The controller's context once namespace team-a serves ``team`` (None: no team)."""
    return dataclasses.replace(CTX, team_of=lambda ns: team if ns == "team-a" else None)


@pytest.mark.parametrize("now_serves", [None, "other"], ids=["label-removed", "label-changed"])
def test_a_run_whose_namespace_changed_team_is_stopped_as_the_team_it_was_posted_for(
    now_serves: str | None,
) -> None:
    """Issue 50: the stop went out with the namespace's team of the moment (none at all once
    the label was removed), so the request posted for "main" kept running."""
    run = running()
    assert run["status"]["extraFields"]["team"] == "main"
    step = decide(run, T0 + timedelta(seconds=5), moved_to(now_serves))
    assert step.post is None and stops(step, run)
    assert step.stop is not None and step.stop.attributes["team"] == "main"
    found = condition(step.status or {})
    expected = "InvalidParams" if now_serves is None else st.TEAM_CHANGED
    assert (found["status"], found["reason"]) == ("False", expected)


def test_a_cancel_after_the_label_went_stops_the_request_for_its_own_team() -> None:
    run = running()
    run["spec"]["status"] = "RunCancelled"
    step = decide(run, T0 + timedelta(seconds=5), moved_to(None))
    assert stops(step, run) and step.stop is not None
    assert step.stop.attributes["team"] == "main"


def test_a_reply_must_be_of_the_team_the_attempt_was_posted_for() -> None:
    run = running()
    data = {"version": {"ref": "abc"}, "metadata": [], "artifact": ARTIFACT}
    other = on_reply(run, answer(run, True, data, team="other"), T0, moved_to("other"))
    assert other.status is None and "not the run's team 'main'" in other.dropped
    own = on_reply(run, answer(run, True, data), T0, moved_to("other"))
    assert condition(own.status or {})["status"] == "True"


def test_a_failed_attempt_is_not_retried_for_the_namespaces_new_team() -> None:
    """The retry read the namespace's team of the moment: an attempt posted for "main" was
    followed by one for the team the namespace was moved to."""
    run = running(customrun(retries=2))
    error = {"kind": "resource_failed", "message": "boom"}
    step = on_reply(run, answer(run, False, {"error": error}), T0, moved_to("other"))
    assert step.post is None
    found = condition(step.status or {})
    assert (found["status"], found["reason"]) == ("False", st.TEAM_CHANGED)
    assert "'other'" in found["message"] and "'main'" in found["message"]
