"""The controller's reply receiver over HTTP (functions/tekton/receiver.py): a reply says how a
run ended, so it is taken only with a token of the reply Trigger's identity, reviewed by the
API server (here a table; the real TokenReview runs on the cluster): 401 without a valid one,
403 for another identity, before the body is read (issue 50). And the controller refuses to
start without sender authentication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.errors import ConfigError, Unavailable
from functions.http.senders import SenderCheck
from functions.tekton import status as st
from functions.tekton.controller_config import ControllerConfig
from functions.tekton.decide import subject
from functions.tekton.receiver import serve
from testbed.event_sink import EventSink
from tests.fast.test_tekton_controller import Running, customrun

TRIGGER = (
    "system:serviceaccount:resource-functions:tekton-replies-oidc-eventing.knative.dev-trigger"
)
TOKENS = {
    "trigger-token": TRIGGER,
    "pod-token": "system:serviceaccount:knative-eventing:default",
}
AUDIENCE = "resource-functions-tekton-controller"


class Reviewer:
    def __init__(self) -> None:
        self.down = False

    def __call__(self, token: str, audience: str) -> str | None:
        if self.down:
            raise Unavailable("Kubernetes API unreachable (create tokenreviews)")
        return TOKENS.get(token) if audience == AUDIENCE else None


@pytest.fixture
def receiver(sink: EventSink) -> Iterator[tuple[Running, str, Reviewer]]:
    running = Running(sink, repost_first=60)
    running.thread.start()
    reviewer = Reviewer()
    server = serve(running.controller, "127.0.0.1", 0, SenderCheck(reviewer, AUDIENCE, (TRIGGER,)))
    yield running, f"http://127.0.0.1:{server.server_address[1]}", reviewer
    server.shutdown()
    running.controller.stopped.set()
    running.thread.join(10)


def reply_to(running: Running, name: str) -> tuple[dict[str, str], bytes]:
    """The get function's success reply to the attempt under way of CustomRun ``name``."""
    running.wait(
        "the run posted", lambda: running.condition("team-a", name).get("reason") == st.RUNNING
    )
    request = running.api.status_of("team-a", name)["extraFields"]["requestId"]
    event = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": "dev.resourcefunctions.get.succeeded",
            "source": "/resource-functions/get",
            "id": f"reply-{request}",
            "subject": subject("team-a", name),
            "requestid": request,
            "team": "team-a",
            "datacontenttype": "application/json",
        },
        data={"version": {"ref": "1"}, "metadata": [], "artifact": {"url": "s3://b/k"}},
    )
    message = to_binary_event(event)
    return dict(message.headers), message.body


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, 401), ("forged", 401), ("pod-token", 403)],
    ids=["no-token", "forged", "another-identity"],
)
def test_a_reply_without_the_triggers_token_changes_nothing(
    receiver: tuple[Running, str, Any], token: str | None, status: int
) -> None:
    running, url, _ = receiver
    running.api.create(customrun("forged"))
    headers, body = reply_to(running, "forged")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answer = requests.post(url, headers=headers, data=body, timeout=10)
    assert answer.status_code == status
    assert running.condition("team-a", "forged").get("reason") == st.RUNNING


def test_a_reply_with_the_triggers_token_ends_the_run(receiver: tuple[Running, str, Any]) -> None:
    running, url, reviewer = receiver
    running.api.create(customrun("real"))
    headers, body = reply_to(running, "real")
    headers["Authorization"] = "Bearer trigger-token"
    reviewer.down = True
    assert requests.post(url, headers=headers, data=body, timeout=10).status_code == 503
    reviewer.down = False
    assert requests.post(url, headers=headers, data=body, timeout=10).status_code == 202
    assert running.condition("team-a", "real").get("status") == "True"


def test_the_controller_refuses_to_start_without_sender_authentication() -> None:
    env = {"K_SINK": "http://broker", "STORE_URL": "s3://bucket/ci", "POD_NAMESPACE": "rf"}
    with pytest.raises(ConfigError, match="sender authentication"):
        ControllerConfig.from_env(env)
    assert ControllerConfig.from_env({**env, "SENDER_AUDIENCE": "resource-functions"})
