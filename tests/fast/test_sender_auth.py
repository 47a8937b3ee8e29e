"""SENDER_AUDIENCE through the HTTP layer: no or a bad token is 401, an identity outside
ALLOWED_SENDERS is 403, both before the body is read and before anything runs; decisions are
kept a minute per token. The reviewer here is a table; the real TokenReview is exercised on
the test cluster (tests/cluster/test_functions_on_kubernetes.py)."""

from __future__ import annotations

from typing import Any

from functions.errors import Unavailable
from functions.http.senders import REFUSED_SECONDS, REMEMBER_SECONDS, SenderCheck
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post

BROKER = "system:serviceaccount:resource-functions:check-oidc-eventing.knative.dev-trigger"
OTHER = "system:serviceaccount:team-a:default"
TOKENS = {"broker-token": BROKER, "other-token": OTHER}


class Reviewer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.down = False

    def __call__(self, token: str, audience: str) -> str | None:
        self.calls.append((token, audience))
        if self.down:
            raise Unavailable("Kubernetes API unreachable (create tokenreviews)")
        return TOKENS.get(token) if audience == "resource-functions" else None


def client(store: Store, runtime: FakeRuntime, reviewer: Reviewer, now: list[float]) -> Any:
    senders = SenderCheck(
        reviewer,
        "resource-functions",
        ("system:serviceaccount:resource-functions:*-oidc-eventing.knative.dev-trigger",),
        clock=lambda: now[0],
    )
    config = {"sender_audience": "resource-functions"}
    return make_client(store, "check", runtime, senders=senders, **config)


def bearer(token: str) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {token}"}}


def test_only_allowed_identities_may_send(store: Store) -> None:
    runtime, reviewer, now = FakeRuntime(store), Reviewer(), [0.0]
    app = client(store, runtime, reviewer, now)
    missing = post(app, event())
    assert missing.status_code == 401 and "bearer token" in missing.get_json()["error"]["message"]
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert post(app, event(), **bearer("forged")).status_code == 401
    refused = post(app, event(), **bearer("other-token"))
    assert refused.status_code == 403 and OTHER in refused.get_json()["error"]["message"]
    assert runtime.ran == []
    assert post(app, event(), **bearer("broker-token")).status_code == 200
    assert len(runtime.ran) == 1


def test_a_decision_is_kept_a_minute_and_an_unreachable_api_is_503(store: Store) -> None:
    runtime, reviewer, now = FakeRuntime(store), Reviewer(), [0.0]
    app = client(store, runtime, reviewer, now)
    for n in range(3):
        assert post(app, event(id=f"e{n}"), **bearer("broker-token")).status_code == 200
    assert reviewer.calls == [("broker-token", "resource-functions")]
    reviewer.down = True
    now[0] += REMEMBER_SECONDS + 1
    down = post(app, event(id="e9"), **bearer("broker-token"))
    assert down.status_code == 503 and len(runtime.ran) == 3


def test_a_refused_token_is_remembered_briefly_so_repeating_it_costs_one_review(
    store: Store,
) -> None:
    runtime, reviewer, now = FakeRuntime(store), Reviewer(), [0.0]
    app = client(store, runtime, reviewer, now)
    for n in range(5):
        assert post(app, event(id=f"e{n}"), **bearer("forged")).status_code == 401
    assert reviewer.calls == [("forged", "resource-functions")]
    now[0] += REFUSED_SECONDS + 1
    assert post(app, event(id="e9"), **bearer("forged")).status_code == 401
    assert len(reviewer.calls) == 2 and runtime.ran == []
