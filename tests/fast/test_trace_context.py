"""The CloudEvents distributed-tracing extension: a request's traceparent/tracestate go on to
its reply event, its version.discovered events (sync or async) and into the task's env; an invalid traceparent is ignored (W3C), never an
error, and never reaches a header or an env var."""

from __future__ import annotations

import pytest

from functions.model import HistoryPlan, Outcome, ReplyAddress, TraceContext
from functions.replies import reply_events
from functions.tracing import trace_context
from storage import Store
from testbed.event_sink import event_sink
from testbed.repository_runtime import RepositoryRuntime
from tests.support.http_helpers import FakeRuntime, event, make_client, post, reply_of
from tests.support.http_helpers import check_client as history_client

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


@pytest.mark.parametrize("action", ["check", "get"])
def test_the_trace_context_reaches_the_reply_and_the_task(store: Store, action: str) -> None:
    runtime = FakeRuntime(store)
    data = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}
    response = post(
        make_client(store, action, runtime),
        event(action, data, traceparent=PARENT, tracestate=STATE),
    )
    reply = reply_of(response)
    assert reply.get_extension("traceparent") == PARENT
    assert reply.get_extension("tracestate") == STATE
    assert runtime.ran[0].env["TRACEPARENT"] == PARENT
    assert runtime.ran[0].env["TRACESTATE"] == STATE


def test_a_request_without_one_adds_nothing(store: Store) -> None:
    runtime = FakeRuntime(store)
    reply = reply_of(post(make_client(store, "check", runtime), event("check")))
    assert reply.get_extension("traceparent") is None
    assert runtime.ran[0].env == {}  # a check's env stays empty, as Concourse's


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        PARENT + "\r\nx-injected: 1",
    ],
    ids=["no-flags", "zero-trace-id", "version-ff", "upper-case", "header-injection"],
)
def test_an_invalid_traceparent_is_ignored(traceparent: str) -> None:
    assert trace_context(traceparent, STATE) is None


def test_an_invalid_tracestate_alone_is_dropped() -> None:
    context = trace_context(PARENT, "a=" + "x" * 600)
    assert context is not None and context.tracestate == ""


def test_the_version_discovered_events_carry_the_trace_context(store: Store) -> None:
    runtime = RepositoryRuntime(store)
    with event_sink() as sink:
        functions = history_client(store, runtime, sink.url)
        request = event(
            "check",
            {"type": "git", "source": {"uri": "x"}, "version": "latest-known"},
            traceparent=PARENT,
            tracestate=STATE,
        )
        assert post(functions, request).status_code == 200
        posted = sink.drain()
    assert [e.get_data()["version"] for e in posted] == [{"ref": "1"}]
    assert {(e.get_extension("traceparent"), e.get_extension("tracestate")) for e in posted} == {
        (PARENT, STATE)
    }


@pytest.mark.parametrize(
    ("trace", "extensions"),
    [(TraceContext(PARENT, STATE), (PARENT, STATE)), (None, (None, None))],
    ids=["traced", "untraced"],
)
def test_every_event_an_async_run_posts_carries_the_trace_context(
    trace: TraceContext | None, extensions: tuple[str | None, str | None]
) -> None:
    posted = reply_events(
        "check",
        Outcome(action="check", data={"versions": [], "new": [{"ref": "2"}]}),
        ReplyAddress("r1", "0" * 32, trace=trace),
        HistoryPlan("h" * 64, limit=10),
    )
    assert [e.get_type().rsplit(".", 1)[-1] for e in posted] == ["discovered", "succeeded"]
    assert {(e.get_extension("traceparent"), e.get_extension("tracestate")) for e in posted} == {
        extensions
    }
