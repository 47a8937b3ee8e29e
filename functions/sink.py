"""Posting events to K_SINK (replies, discovered versions, requests), with bounded retries.

With Knative Eventing's ``authentication-oidc`` on, a SinkBinding mounts a token of its own
identity for the sink's audience at ``/oidc/token`` (renewed by Knative: read at each post),
and the Broker takes events only with such a token: every post carries it when the file is
there (``K_SINK_TOKEN_FILE`` names another file). A post to the reply relay carries the run's
reply token instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import requests
from cloudevents.core.v1.event import CloudEvent
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from functions.errors import SinkRefused
from functions.events import to_http
from functions.model import Outcome, Task
from functions.replies import reply_events
from storage.store_errors import retryable_status

# Retried by the session (storage.store_errors.retryable_status's table, as urllib3 wants it).
RETRYABLE = frozenset(s for s in range(400, 600) if retryable_status(s))
RUN_HEADER = "Resource-Functions-Run"  # the run whose events a relayed POST carries
SINK_TOKEN_FILE = "/oidc/token"  # where Knative's SinkBinding mounts its token (OIDC on)


def sink_token_headers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``Authorization`` header of the SinkBinding's token for K_SINK's audience, or none
    when there is no token file (``authentication-oidc`` off)."""
    env = os.environ if environ is None else environ
    path = env.get("K_SINK_TOKEN_FILE") or SINK_TOKEN_FILE
    try:
        token = Path(path).read_text().strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class RelayToken:
    """A run's reply token (``keys.reply_token``), shown to the reply relay with each event."""

    run: str
    token: str = field(repr=False)


def session(attempts: int = 5) -> requests.Session:
    """A session that retries connection errors and RETRYABLE answers with exponential
    backoff (0.5 s, 1 s, 2 s, …), honouring Retry-After. POST is retried: the reply event
    carries its id, and sinks (the Broker) de-duplicate or tolerate redelivery. Its pool
    keeps the connection (and the name's lookup) for the next event to the same sink."""
    retry = Retry(
        total=attempts - 1,
        backoff_factor=0.5,
        status_forcelist=RETRYABLE,
        allowed_methods=frozenset({"POST"}),
        raise_on_status=False,
    )
    made = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    made.mount("http://", adapter)
    made.mount("https://", adapter)
    return made


def post_reply(
    sink: str,
    event: CloudEvent,
    *,
    attempts: int = 5,
    timeout: float = 30,
    token: RelayToken | None = None,
    through: requests.Session | None = None,
) -> None:
    """POST the event in binary mode; retry transient failures. Raises ``SinkRefused``
    (its cause the ``requests`` error) when the sink will not take it. ``token``: the run's
    reply token, for the reply relay (``functions.http.reply_relay``). ``through``: a
    ``session`` to post with (its retries then apply), else one of ``attempts``."""
    headers, body = to_http(event)
    if token is not None:
        headers = {**headers, RUN_HEADER: token.run, "Authorization": f"Bearer {token.token}"}
    else:
        headers = {**headers, **sink_token_headers()}
    with nullcontext(through) if through is not None else session(attempts) as used:
        try:
            response = used.post(sink, headers=headers, data=body, timeout=timeout)
        except requests.RequestException as err:
            raise SinkRefused(f"sink {sink} unreachable: {err}") from err
    if response.status_code >= 300:
        raise SinkRefused(f"sink {sink} answered {response.status_code}", response.status_code)


def post_events(sink: str, events: Sequence[CloudEvent], token: RelayToken | None = None) -> None:
    """POST each event in order (``post_reply``), over one connection; stops at the first
    ``SinkRefused``."""
    with session() as used:
        for event in events:
            post_reply(sink, event, token=token, through=used)


def post_outcome(sink: str, task: Task, outcome: Outcome) -> None:
    """Send the events of an asynchronous task to ``sink``: its discovered versions and its
    reply (``replies.reply_events``)."""
    post_events(sink, reply_events(task.action, outcome, task.reply_address, task.history))
