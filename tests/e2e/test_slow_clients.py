"""Slow clients hold no thread (issue 50): the reply relay under gunicorn, as served in the
cluster, with 4 threads and a hundred connections sending their heads a byte at a time (no
token needed to be slow), and others sending their bodies so. Before, each held a thread for
as long as it trickled, and /healthz and every reply waited behind them. Now the event loop
reads heads and bodies (``functions/http/prefetching_worker.py``): the others are answered
at once, and each slow one gets 408 at its deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests

from functions.http.prefetching_worker import HEAD_SECONDS
from testbed.event_sink import EventSink
from tests.support.services import Services, running_services
from tests.support.slow_clients import Trickle

SLOW = 100
THREADS = 4


@pytest.fixture
def relay(sink: EventSink, tmp_path) -> Iterator[Services]:
    env = {"CACHE_SECRET": "e2e", "K_SINK": sink.url, "THREADS": str(THREADS)}
    with running_services(env, tmp_path / "relay.log", actions=("reply-relay",)) as services:
        yield services


@pytest.mark.parametrize("slow", ["heads", "bodies"])
def test_slow_clients_hold_no_thread_and_get_408_at_their_deadline(
    relay: Services, slow: str
) -> None:
    url = relay.urls["reply-relay"]
    head = b"POST / HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
    if slow == "heads":
        trickle = Trickle(url, SLOW, b"POST / HT", b"TP/1.1\r\nHost: relay\r\n" * 20, 0.2)
    else:
        prefix = head + b"Content-Length: 4000\r\n\r\n{"
        trickle = Trickle(url, SLOW, prefix, b" " * 2000, 0.2)
    try:
        time.sleep(1.0)  # every slow one has started, and would hold a thread by now
        for _ in range(3 * THREADS):  # each within 5 s, well before any slow one's deadline
            assert requests.get(url + "/healthz", timeout=5).status_code == 200
            refused = requests.post(url + "/", data=b"{}", timeout=5)
            assert refused.status_code == 401  # no reply token: answered, by a thread
        answers = trickle.answers(timeout=HEAD_SECONDS + 10)
    finally:
        trickle.close()
    assert answers == [b"HTTP/1.1 408 Request Timeout"] * SLOW


def test_a_second_request_begun_behind_a_first_is_read_by_the_loop_too(relay: Services) -> None:
    """A connection sends a whole request and the first bytes of a second in one packet, then
    the rest a byte at a time: gunicorn's drain had read those bytes ahead, and a thread took
    the connection and waited on the rest. Now the loop reads on from them."""
    url = relay.urls["reply-relay"]
    first = b"GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"
    trickle = Trickle(url, SLOW, first + b"GET /heal", b"thz HTTP/1.1\r\nHost: r\r\n" * 20, 0.2)
    try:
        time.sleep(1.0)
        for _ in range(3 * THREADS):
            assert requests.get(url + "/healthz", timeout=5).status_code == 200
    finally:
        trickle.close()


def test_a_content_length_of_thousands_of_digits_is_refused_and_the_service_stays(
    relay: Services,
) -> None:
    host, port = relay.urls["reply-relay"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
        status = conn.recv(4096).split(b"\r\n", 1)[0]
    assert status.split()[1][:1] == b"4", status  # refused as the client's fault
    assert requests.get(relay.urls["reply-relay"] + "/healthz", timeout=5).status_code == 200
