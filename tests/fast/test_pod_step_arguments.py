"""The pod steps' arguments: what the Job spec writes (``argv``) is what the step reads
(``parse``), for any values the function can put there."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from functions.model import (
    ACTIONS,
    FAILURE_KINDS,
    ArtifactRef,
    HistoryPlan,
    LeaseHold,
    TraceContext,
)
from functions.steps.pod_contract import (
    TERMINATION_MESSAGE_BYTES,
    CollectStep,
    ReplyPlan,
    StageStep,
    StepArgsError,
    StepFailure,
)

HEX = "0123456789abcdef"
# Event ids, subjects and keys are any Unicode text (the request's validation keeps NUL and
# lone surrogates out: they cannot travel in a pod spec), including text that starts with "-".
text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=40
)
digests = st.text(HEX, min_size=64, max_size=64).map(lambda h: f"sha256:{h}")
refs = st.builds(ArtifactRef, key=text, digest=st.none() | digests)
names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00="), min_size=1)
traces = st.builds(
    TraceContext,
    traceparent=st.tuples(
        st.text(HEX, min_size=32, max_size=32), st.text(HEX, min_size=16, max_size=16)
    )
    .filter(lambda ids: set(ids[0]) != {"0"} and set(ids[1]) != {"0"})
    .map(lambda ids: f"00-{ids[0]}-{ids[1]}-01"),
    tracestate=st.sampled_from(["", "congo=t61rcWkgMzE", "a=1,b=2"]),
)
replies = st.builds(
    ReplyPlan, request_id=text, subject=st.none() | text, trace=st.none() | traces, team=text
)


@given(
    directory=text,
    inputs=st.lists(st.tuples(names, refs), max_size=4).map(tuple),
    task_dir=st.sampled_from(["/tmp/build/.task", "/elsewhere/.task"]),
)
@example(directory="--", inputs=(), task_dir="/tmp/build/.task")
def test_stage_arguments_round_trip(
    directory: str, inputs: tuple[tuple[str, ArtifactRef], ...], task_dir: str
) -> None:
    step = StageStep(directory=directory, inputs=inputs, task_dir=task_dir)
    assert step.argv()[0] == "stage"
    assert StageStep.parse(step.argv()[1:]) == step


@given(
    run_id=st.text(HEX, min_size=32, max_size=32),
    action=st.sampled_from(ACTIONS),
    cache_key=st.none() | st.text(HEX, min_size=64, max_size=64),
    history=st.none() | st.builds(HistoryPlan, resource_key=text, limit=st.integers(1, 10**6)),
    lease=st.none() | st.builds(LeaseHold, key=text, holder=text),
    reply=st.none() | replies,
)
def test_collect_arguments_round_trip(
    run_id: str,
    action: str,
    cache_key: str | None,
    history: HistoryPlan | None,
    lease: LeaseHold | None,
    reply: ReplyPlan | None,
) -> None:
    step = CollectStep(
        run_id=run_id,
        action=action,  # type: ignore[arg-type]
        cache_key=cache_key,
        history=history,
        lease=lease,
        reply=reply,
    )
    assert step.argv()[0] == "collect"
    assert CollectStep.parse(step.argv()[1:]) == step


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--action=get"], "--run-id"),
        (["--run-id=a", "--action=fetch"], "--action"),
        (["--run-id=a", "--action=check", "--lease-key=k"], "go together"),
        (["--run-id=a", "--action=check", "--reply-to-sink", "--traceparent=x"], "not valid"),
    ],
    ids=["no-run-id", "unknown-action", "half-a-lease", "bad-traceparent"],
)
def test_malformed_collect_arguments_say_what_is_wrong(argv: list[str], problem: str) -> None:
    with pytest.raises(StepArgsError, match=problem):
        CollectStep.parse(argv)


def test_a_malformed_input_argument_says_what_is_wrong() -> None:
    with pytest.raises(StepArgsError, match="NAME=KEY"):
        StageStep.parse(["--dir=/tmp/build/put", "--input=no-separator"])


@given(
    kind=st.sampled_from(sorted(FAILURE_KINDS)),
    retryable=st.booleans(),
    message=st.text(max_size=3000)
    | st.text(st.sampled_from('é"\\\n\x01😀'), min_size=500, max_size=3000),
)
def test_a_step_failure_fits_its_termination_message_and_parses_back(
    kind: str, retryable: bool, message: str
) -> None:
    """Whatever the message (escapes make a character up to 12 bytes of JSON), the step's
    termination message fits the kubelet's budget and is still the failure: its kind, whether
    it is retryable, and the message's tail."""
    text = StepFailure(kind, retryable, message).termination_message()  # type: ignore[arg-type]
    assert len(text.encode()) <= TERMINATION_MESSAGE_BYTES
    parsed = StepFailure.parse(text)
    assert parsed is not None
    assert (parsed.kind, parsed.retryable) == (kind, retryable)
    assert message.endswith(parsed.message)
    assert len(parsed.message) >= min(len(message), TERMINATION_MESSAGE_BYTES // 12 - 10)
