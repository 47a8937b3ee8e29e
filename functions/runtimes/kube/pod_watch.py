"""One watch of the task pods per runtime, shared by every run it follows.

A thread lists the pods of the task namespace that carry the task label (``selector``),
then watches them from the list's resourceVersion, and again: after each watch request
(``seconds`` long, so the view is rebuilt from a list that often), after 410 Gone, and after an
error (logged; it retries with a growing pause). It keeps each pod's metadata and status (not
its spec) by Job name. A run ``follow``s its Job: it reads the pods from the view and waits for
them to change. So a followed run costs the API no request of its own to see its pod, and a
replica keeps one watch open however many runs it follows.

The thread starts with the first ``follow`` and ends at ``close`` (which also wakes every
follower, so that it sees the runtime closing). Until the first list has answered, the view is
empty: a follower then waits as for a pod not created yet. A view that no list has renewed for
longer than a healthy watch takes (``seconds`` plus the longest pause) is stale: followers then
list their own Job's pods, as each run did before the watch was shared, until it recovers.
The pause grows while watches fail, also when the list before them answered, and from the
second 410 Gone in a row: a watch that cannot work costs a few requests a minute, not a loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from functions.errors import Gone, KubeApiError, Unavailable
from functions.kube.api import JOB_NAME_LABELS, KubeApi, belongs
from functions.logs import fields

log = logging.getLogger("functions.kubernetes")

FIRST_PAUSE = 0.5  # after an error, before listing again; doubles up to MAX_PAUSE
MAX_PAUSE = 10.0
STALE_SLACK = 5.0  # beyond a watch's time and the longest pause: its read timeout
SHORT_WATCH = 1.0  # a watch that ended sooner (or in half its time) with no event failed
Pods = dict[str, dict[str, Any]]  # pod name -> pod (metadata and status)


class PodWatch:
    def __init__(self, api: KubeApi, selector: str, seconds: float) -> None:
        self._api = api
        self._selector = selector
        self._seconds = seconds
        self._lock = threading.Lock()
        self._by_job: dict[str, Pods] = {}
        self._followers: dict[str, _Follower] = {}
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._listed_at = time.monotonic()  # or the thread's start: the view's age
        self._short_watch = min(SHORT_WATCH, seconds / 2)

    @contextmanager
    def follow(self, job: str) -> Iterator[Following]:
        """Follow Job ``job``'s pods for the block (the watch starts if it has not)."""
        with self._lock:
            follower = self._followers.get(job)
            if follower is None:
                follower = self._followers[job] = _Follower(threading.Condition(self._lock))
            follower.count += 1
        try:
            with self._lock:
                if self._thread is None and not self._closed.is_set():
                    thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
                    thread.start()
                    self._thread, self._listed_at = thread, time.monotonic()
            yield Following(self, job, follower)
        finally:
            with self._lock:
                follower.count -= 1
                if follower.count == 0:
                    del self._followers[job]

    def close(self) -> None:
        """Stop watching (at the end of the current watch request at the latest) and wake
        every follower."""
        self._closed.set()
        with self._lock:
            for follower in self._followers.values():
                follower.changed()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def stale(self) -> bool:
        """Whether no list has renewed the view for longer than a healthy watch takes."""
        return time.monotonic() - self._listed_at > self._seconds + MAX_PAUSE + STALE_SLACK

    def list_job(self, job: str) -> list[dict[str, Any]]:
        """Job ``job``'s pods, read from the API (for a follower while the view is stale)."""
        pods, _ = self._api.list_pods(f"{JOB_NAME_LABELS[0]}={job}")
        return [trimmed(pod) for pod in pods]

    def _run(self) -> None:
        pause, gone = FIRST_PAUSE, 0
        while not self._closed.is_set():
            try:
                version = self._list()
                started = time.monotonic()
                if self._watch(version) or time.monotonic() - started >= self._short_watch:
                    pause, gone = FIRST_PAUSE, 0
                    continue
                failure = "the watch ended at once with no event"
            except Gone:
                gone += 1
                if gone == 1:
                    continue  # the list's version is too old already: list again
                failure = f"410 Gone {gone} times in a row"
            except (Unavailable, KubeApiError) as err:
                failure = str(err)
            except Exception as err:  # a bug: followers read their own pods once it is stale
                log.exception("the task pod watch failed; trying again")
                failure = f"{type(err).__name__}: {err}"
            log.warning(
                "cannot watch the task pods; trying again",
                extra=fields(error=failure, pause=pause),
            )
            self._closed.wait(pause)
            pause = min(pause * 2, MAX_PAUSE)

    def _list(self) -> str:
        pods, version = self._api.list_pods(self._selector)
        by_job: dict[str, Pods] = {}
        for pod in pods:
            job = job_of(pod)
            if job:
                by_job.setdefault(job, {})[pod["metadata"]["name"]] = trimmed(pod)
        with self._lock:
            before, self._by_job, self._listed_at = self._by_job, by_job, time.monotonic()
            for job, follower in self._followers.items():
                if before.get(job) != by_job.get(job):  # else its wait runs out: Job read
                    follower.changed()
        return version

    def _watch(self, version: str) -> int:
        """Apply pod events until the watch request ends (its time is up, or it was cut);
        how many came."""
        events = self._api.watch_pods(self._selector, version, self._seconds)
        count = 0
        try:
            for event in events:
                if self._closed.is_set():
                    break
                count += 1
                self._apply(event.get("type") or "", event.get("object") or {})
        finally:
            events.close()
        return count

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        job = job_of(pod)
        if kind == "BOOKMARK" or not job:
            return
        name = pod["metadata"]["name"]
        with self._lock:
            pods = self._by_job.setdefault(job, {})
            if kind == "DELETED":
                pods.pop(name, None)
                if not pods:
                    del self._by_job[job]
            else:
                pods[name] = trimmed(pod)
            follower = self._followers.get(job)
            if follower is not None:
                follower.changed()


class _Follower:
    """The runs following one Job: woken on any change of its pods."""

    def __init__(self, condition: threading.Condition) -> None:
        self.condition = condition
        self.count = 0
        self.changes = 0

    def changed(self) -> None:  # with the watch's lock held
        self.changes += 1
        self.condition.notify_all()


class Following:
    """One run's view of its Job's pods."""

    def __init__(self, watch: PodWatch, job: str, follower: _Follower) -> None:
        self._watch = watch
        self._job = job
        self._follower = follower
        self._seen = -1

    def pods(self, uid: str = "") -> Pods:
        """The Job's pods now (of that ``uid``, if given: not those of an earlier Job of the
        same name), as the watch last saw them, or as the API lists them while the watch's
        view is stale."""
        listed = self._watch.list_job(self._job) if self._watch.stale else None
        with self._watch._lock:
            self._seen = self._follower.changes
            if listed is None:
                pods = dict(self._watch._by_job.get(self._job) or {})
            else:
                pods = {pod["metadata"]["name"]: pod for pod in listed}
        return {name: pod for name, pod in pods.items() if belongs(pod, self._job, uid)}

    def wait(self, seconds: float) -> bool:
        """Until the pods changed since ``pods`` was last called (True), the watch closed
        (True), or ``seconds`` have passed (False)."""
        with self._follower.condition:
            return self._follower.condition.wait_for(
                lambda: self._follower.changes != self._seen or self._watch.closed,
                timeout=max(0.0, seconds),
            )


def job_of(pod: dict[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return next((str(labels[name]) for name in JOB_NAME_LABELS if labels.get(name)), "")


def trimmed(pod: dict[str, Any]) -> dict[str, Any]:
    """What judging a pod needs (``job_status``, ``belongs``): metadata and status."""
    metadata = pod.get("metadata") or {}
    kept = ("name", "labels", "ownerReferences", "deletionTimestamp", "uid")
    return {
        "metadata": {key: metadata[key] for key in kept if key in metadata},
        "status": pod.get("status") or {},
    }
