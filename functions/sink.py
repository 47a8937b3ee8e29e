"""Posting a reply event to K_SINK (asynchronous completion), with bounded retries."""
from __future__ import annotations

import time

import requests
from cloudevents.core.v1.event import CloudEvent

from functions.events import reply_event, to_http
from functions.model import Outcome, Task

RETRYABLE = {408, 409, 429, 500, 502, 503, 504}


def post_reply(sink: str, event: CloudEvent, *, attempts: int = 5, timeout: float = 30) -> None:
    """POST the event in binary mode; retry transient failures with exponential backoff.
    Raises ``requests.RequestException`` when the sink will not take it."""
    headers, body = to_http(event)
    delay = 0.5
    for attempt in range(1, attempts + 1):
        try:
            response = requests.post(sink, headers=headers, data=body, timeout=timeout)
            if response.status_code < 300:
                return
            if response.status_code not in RETRYABLE or attempt == attempts:
                raise requests.HTTPError(
                    f"sink {sink} answered {response.status_code}", response=response)
        except (requests.ConnectionError, requests.Timeout):
            if attempt == attempts:
                raise
        time.sleep(delay)
        delay *= 2


def post_outcome(sink: str, task: Task, outcome: Outcome) -> None:
    """Send the reply event of an asynchronous task to ``sink``."""
    event = reply_event(action=task.action, outcome=outcome, request_id=task.request_id,
                        subject=task.subject, run_id=task.run_id)
    post_reply(sink, event)
