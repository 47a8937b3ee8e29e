"""``/readyz`` (readiness: the store and the runtime answer) apart from ``/healthz``
(liveness: the process serves)."""

from __future__ import annotations

from functions.http.readiness import READY_SECONDS, Readiness
from storage import Store
from tests.support.http_helpers import FakeRuntime, make_client


def test_ready_when_the_store_and_the_runtime_answer(store: Store) -> None:
    client = make_client(store, "get", FakeRuntime(store))
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.get_json() == {"status": "ready", "action": "get"}


def test_a_runtime_that_does_not_answer_is_not_ready_but_alive(store: Store) -> None:
    runtime = FakeRuntime(store)
    runtime.unready = "the container engine does not answer: connection refused"
    client = make_client(store, "check", runtime)
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.get_json()["runtime"] == (
        "Unavailable: the container engine does not answer: connection refused"
    )
    assert "store" not in answer.get_json()
    assert client.get("/healthz").status_code == 200  # not restarted for it


def test_a_success_is_trusted_for_a_few_seconds_then_probed_again(store: Store) -> None:
    now = [100.0]
    runtime = FakeRuntime(store)
    readiness = Readiness(store, runtime, clock=lambda: now[0])
    assert readiness.probe()[0] == 200
    runtime.unready = "down"
    now[0] += READY_SECONDS - 0.1
    assert readiness.probe()[0] == 200
    now[0] += 0.2
    assert readiness.probe() == (503, {"status": "not ready", "runtime": "Unavailable: down"})
    runtime.unready = ""
    assert readiness.probe()[0] == 200  # a failure is never remembered
