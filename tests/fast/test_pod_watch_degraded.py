"""The shared pod watch when the API half works (``functions/runtimes/kube/pod_watch.py``): lists
answer but watches fail, 410 Gone again and again, or nothing answers for long. kmock's
emulator answers a list and a watch of the same path alike, so these use a stand-in of the two
``KubeApi`` calls the watch makes, scripted per call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.errors import Gone, Unavailable
from functions.runtimes.kube import pod_watch
from functions.runtimes.kube.pod_watch import PodWatch

JOB = "rf-job-1"


def pod(name: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"job-name": JOB}, "uid": name},
        "status": {"phase": phase},
    }


class ScriptedApi:
    """``list_pods`` and ``watch_pods`` as the watch calls them, each answer chosen by a
    function of the call; every call recorded as (name, selector)."""

    def __init__(self, list_answer: Any, watch_answer: Any) -> None:
        self.list_answer, self.watch_answer = list_answer, watch_answer
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        with self.lock:
            self.calls.append(("list", selector))
        return self.list_answer(selector), "7"

    def watch_pods(self, selector: str, version: str, seconds: float) -> Iterator[Any]:
        with self.lock:
            self.calls.append(("watch", selector))
        return self.watch_answer()

    def count(self, name: str, selector: str = "app=tasks") -> int:
        with self.lock:
            return sum(1 for call in self.calls if call == (name, selector))


def failing_watch() -> Iterator[Any]:
    raise Unavailable("the API answered the watch with 503")


def gone_watch() -> Iterator[Any]:
    raise Gone("too old resource version")


def empty_watch() -> Iterator[Any]:
    yield from ()  # a generator, closable as the API's event stream is


def follow_until(watch: PodWatch, condition: Any) -> float:
    """Follow a Job until ``condition()`` holds; the seconds that took."""
    started = time.monotonic()
    with watch.follow(JOB):
        end = started + 20  # bounds a failure only
        while not condition():
            assert time.monotonic() < end, "the watch did not list again"
            time.sleep(0.01)
        seconds = time.monotonic() - started
    watch.close()
    return seconds


@pytest.mark.parametrize("watch_answer", [failing_watch, gone_watch, empty_watch])
def test_a_watch_that_keeps_failing_after_good_lists_backs_off(
    watch_answer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists answer, the watch after each fails at once (an error, 410 Gone every time, or an
    end with no event): the pause still grows, here 0.1 s, 0.2 s, 0.4 s…, so the fourth list
    comes 0.7 s after the first (a first 410 lists again at once: the fifth), not 0.3 s after
    (a pause that does not grow) or at once. Time only adds to that on a busy machine."""
    monkeypatch.setattr(pod_watch, "FIRST_PAUSE", 0.1)
    api = ScriptedApi(lambda selector: [], watch_answer)
    lists = 5 if watch_answer is gone_watch else 4
    watch = PodWatch(api, "app=tasks", seconds=30)  # type: ignore[arg-type]
    seconds = follow_until(watch, lambda: api.count("list") >= lists)
    assert seconds >= 0.6, (seconds, api.calls[:10])


def test_a_follower_lists_its_own_pods_while_the_view_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing renews the view (every list of the task pods fails): past the time a healthy
    watch takes, a follower reads its Job's pods from the API itself, and so sees a pod that
    the watch never reported."""
    monkeypatch.setattr(pod_watch, "MAX_PAUSE", 0.2)
    monkeypatch.setattr(pod_watch, "STALE_SLACK", 0.2)

    def lists(selector: str) -> list[dict[str, Any]]:
        if selector == "app=tasks":
            raise Unavailable("etcd is away")
        return [pod("rf-job-1-abcde", "Failed")]

    api = ScriptedApi(lists, empty_watch)
    watch = PodWatch(api, "app=tasks", seconds=0.2)  # type: ignore[arg-type]
    with watch.follow(JOB) as following:
        assert following.pods() == {}  # fresh, and empty: as for a pod not created yet
        time.sleep(1.0)
        assert watch.stale
        seen = following.pods()
    watch.close()
    assert (
        list(seen) == ["rf-job-1-abcde"] and seen["rf-job-1-abcde"]["status"]["phase"] == "Failed"
    )
    assert api.count("list", f"job-name={JOB}") == 1
