"""The CloudEvents distributed-tracing extension: a request's traceparent/tracestate go on to
its reply event and into the task's env; an invalid traceparent is ignored (W3C), never an
error, and never reaches a header or an env var."""

from __future__ import annotations

import pytest

from functions.tracing import trace_context
from storage import Store
from tests.fast.test_http_service import FakeRuntime, event, make_client, post, reply_of

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
