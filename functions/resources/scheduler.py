"""The scheduler's shell around ``decide``: the Tekton controller's reconciler shape, for
Resources.

- A LIST (paged, each object decoded alone) and WATCH of Resources cluster-wide keeps a cache,
  and puts each changed one's key on a work queue (``WorkQueue``: deduped, one worker per key,
  delayed adds are the timers: a key sleeps until its next slot).
- Workers reconcile one key each under its lock: ``decide``, write the status when it
  changed (guarded by the resourceVersion; a conflict re-reads and retries), then hand the
  post to a poster and queue the key for its wake time.
- Posters wait for the rate limiter (``RateLimit``: the resources' mean rate, Σ 1/interval,
  unless ``RESOURCE_CHECKS_PER_SECOND`` sets one) and post to the Broker. The status claim is
  written before the post: a crash between them leaves a claim the next leader posts again,
  under the same request id.
- Replies (``reply``, from the receiver) are applied under the key's lock, on any replica.

Only the leader runs ``run``; the controller's ``LeaderElection`` decides (``receiver.main``).
Nothing of a Resource's source is logged: lines name the object and the request id only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

from cloudevents.core.v1.event import CloudEvent

from functions.errors import Conflict, NotFound, SinkRefused, Unavailable
from functions.kube.custom_objects import CustomObjects
from functions.kube.objects import ListEnd, Undecodable
from functions.resources.decisions import (
    API_VERSION,
    Context,
    Step,
    condition_of,
    decide,
    interval_of,
    on_reply,
)
from functions.sink import post_reply, session
from functions.tekton.controller_metrics import ControllerMetrics
from functions.tekton.decide import Posting, Reply
from functions.tekton.work_queue import KeyLocks, WorkQueue, workers

CONFLICT_TRIES = 5
WORKERS = 2
POST_THREADS = 8
RATE_FLOOR = 1.0  # posts a second the limiter allows at least
RATE_READ_SECONDS = 1.0  # how often the limiter reads the resources' mean rate again
RESYNC_SECONDS = 300
log = logging.getLogger("functions.resources")
Key = tuple[str, str]


def utcnow() -> datetime:
    return datetime.now(UTC)


class RateLimit:
    """A token bucket: ``rate()`` tokens a second (read again each second at most: the
    resources' mean rate moves as they come and go, and reading it walks them all), at most
    one second's worth saved up."""

    def __init__(self, rate: Callable[[], float], clock: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._clock = clock
        self._tokens = 0.0
        self._at = clock()
        self._lock = threading.Lock()
        self._known = (0.0, -RATE_READ_SECONDS)  # (rate, when read)

    def _current(self, now: float) -> float:
        rate, read = self._known
        if now - read >= RATE_READ_SECONDS:
            rate = max(self._rate(), 1e-3)
            self._known = (rate, now)
        return rate

    def take(self, stopped: threading.Event) -> bool:
        """Wait for a token; False if ``stopped`` was set first."""
        while not stopped.is_set():
            with self._lock:
                now = self._clock()
                rate = self._current(now)
                self._tokens = min(rate, self._tokens + (now - self._at) * rate)
                self._at = now
                if self._tokens >= 1.0 - 1e-9:  # float sums fall just short of 1
                    self._tokens -= 1.0
                    return True
                wait = (1.0 - self._tokens) / rate
            stopped.wait(min(wait, 1.0))
        return False


class Scheduler:
    def __init__(
        self,
        api: CustomObjects,
        ctx: Context,
        broker: str,
        *,
        rate: float | None = None,
        clock: Callable[[], datetime] = utcnow,
        workers: int = WORKERS,
        resync_seconds: float = RESYNC_SECONDS,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._api = api
        self._ctx = ctx
        self._broker = broker
        self._clock = clock
        self._workers = workers
        self._resync = resync_seconds
        self.queue = WorkQueue()
        self._cache: dict[Key, dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._locks = KeyLocks()
        self._posted: set[str] = set()  # request ids this process has posted (or is posting)
        self._posts = ThreadPoolExecutor(POST_THREADS, thread_name_prefix="resource-post")
        self._session = session(3)  # one pool of connections to the Broker for every post
        self._limit = RateLimit(lambda: rate if rate else self.mean_rate())
        self.stopped = threading.Event()
        self.metrics = metrics or ControllerMetrics()

    # --- running ------------------------------------------------------------------------------

    def run(self, stopped: threading.Event | None = None) -> None:
        """Schedule until ``stopped`` (or ``self.stopped``) is set: workers in threads, the
        LIST and WATCH here."""
        if stopped is not None:
            self.stopped = stopped  # the leader's: set when it stops leading
        try:
            with workers(self._work, self._workers, "resource-worker", self.queue):
                while not self.stopped.is_set():
                    try:
                        self.list_and_watch()
                    except NotFound:
                        log.info("no Resource kind here (resource-crd.yaml); again in 60s")
                        self.stopped.wait(60)
                    except Exception:  # the API away: take it up again from a fresh LIST
                        log.exception("resource watch failed; listing again")
                        self.stopped.wait(2)
        finally:
            self._posts.shutdown(wait=False, cancel_futures=True)

    def list_and_watch(self) -> None:
        listed: dict[Key, dict[str, Any]] = {}
        version = ""
        for found in self._api.list():
            if isinstance(found, ListEnd):
                version = found.resource_version
            elif isinstance(found, Undecodable):
                log.warning("resource %s/%s skipped: %s", found.namespace, found.name, found.reason)
            elif found.get("apiVersion") == API_VERSION:
                listed[key_of(found)] = found
        with self._cache_lock:
            self._cache = listed
        for key in listed:
            self.queue.add(key)
        for kind, obj in self._api.watch(version, int(self._resync)):
            if self.stopped.is_set() or kind == "ERROR":
                return
            if kind == "BOOKMARK" or isinstance(obj, Undecodable):
                continue
            key = key_of(obj)
            with self._cache_lock:
                if kind == "DELETED":
                    self._cache.pop(key, None)  # its key finds nothing: no post
                    continue
                self._cache[key] = obj
            self.queue.add(key)

    def _work(self) -> None:
        while not self.stopped.is_set():
            found = self.queue.get(1.0)
            if found is None:
                continue
            key = cast(Key, found)
            try:
                self.reconcile(key)
                self.queue.forget(key)
            except Exception as err:  # noqa: BLE001 - one Resource's failure is its own
                if isinstance(err, Conflict):
                    self._refresh(key)
                delay = self.queue.retry(key)
                log.warning("resource %s/%s: %s; again in %.1fs", key[0], key[1], err, delay)
            finally:
                self.queue.done(key)

    # --- one Resource -------------------------------------------------------------------------

    def reconcile(self, key: Key) -> None:
        with self._locks.held(key):
            with self._cache_lock:
                resource = self._cache.get(key)
            if resource is None:
                return  # deleted: its checks stop
            step = decide(resource, self._clock(), self._ctx, self._was_posted)
            written = self._settle(resource, step)
        if step.post is not None and not self._was_posted(step.post.request_id):
            with self._cache_lock:
                self._posted.add(step.post.request_id)
            self._posts.submit(self._post, key, step.post)
        if step.wake_at is not None and not written.get("spec", {}).get("paused"):
            self.queue.add_after(key, (step.wake_at - self._clock()).total_seconds())

    def reply(self, namespace: str, name: str, reply: Reply) -> None:
        """A reply to a check of Resource ``namespace/name``: applied, or dropped when stale
        or not the check's. Raises when the status could not be written (the receiver
        answers 503: Knative delivers the reply again)."""
        key = (namespace, name)
        for _ in range(CONFLICT_TRIES):
            with self._locks.held(key):
                resource = self._cached(key)
                if resource is None:
                    return
                step = on_reply(resource, reply, self._clock())
                try:
                    self._settle(resource, step)
                    break
                except Conflict:
                    self._refresh(key)
        else:
            raise Unavailable(f"resource {namespace}/{name} kept changing; reply not applied")
        outcome = "dropped" if step.dropped else "applied" if step.status else "stale"
        self.metrics.resource_replies.labels(outcome).inc()
        if step.dropped:
            log.warning("resource %s/%s: reply dropped: %s", namespace, name, step.dropped)
        elif step.status is not None:
            self.queue.add(key)  # its next slot's wake, from the answered status

    def _settle(self, resource: dict[str, Any], step: Step) -> dict[str, Any]:
        """Write the step's status if it changed anything; the object as it is now."""
        before = resource.get("status") or {}
        if step.status is None or step.status == before:
            return resource
        try:
            written = self._api.replace_status(resource, step.status)
        except NotFound:
            return resource
        with self._cache_lock:
            self._cache[key_of(written)] = written
        old, new = condition_of(before) or {}, condition_of(step.status) or {}
        if (old.get("status"), old.get("reason")) != (new.get("status"), new.get("reason")):
            self._event(written, new)
        return written

    def _post(self, key: Key, posting: Posting) -> None:
        if not self._limit.take(self.stopped):
            return
        event = CloudEvent(attributes=posting.attributes, data=posting.data)
        try:
            post_reply(self._broker, event, timeout=30, through=self._session)
        except SinkRefused as err:  # posted again at its next look (decide's schedule)
            self.metrics.resource_posts.labels("refused").inc()
            log.warning("resource %s/%s: check %s not posted: %s", *key, posting.request_id, err)
            return
        except Exception:
            log.exception("resource %s/%s: posting check %s failed", *key, posting.request_id)
            return
        self.metrics.resource_posts.labels("posted").inc()
        log.info("resource %s/%s: check %s posted", *key, posting.request_id)

    def _event(self, resource: dict[str, Any], condition: dict[str, Any]) -> None:
        try:
            self._api.event(
                resource,
                condition.get("status") == "False",
                str(condition.get("reason") or ""),
                str(condition.get("message") or ""),
            )
        except Exception as err:  # noqa: BLE001 - an Event is for people: never worth a retry
            log.info("no Event on resource %s/%s: %s", *key_of(resource), err)

    # --- the cache ----------------------------------------------------------------------------

    def _was_posted(self, request_id: str) -> bool:
        with self._cache_lock:
            return request_id in self._posted

    def _cached(self, key: Key) -> dict[str, Any] | None:
        with self._cache_lock:
            found = self._cache.get(key)
        return found if found is not None else self._refresh(key)

    def _refresh(self, key: Key) -> dict[str, Any] | None:
        found = self._api.read(*key)
        if found is None or isinstance(found, Undecodable):
            with self._cache_lock:
                self._cache.pop(key, None)
            return None
        with self._cache_lock:
            self._cache[key] = found
        return found

    def mean_rate(self) -> float:
        """Σ 1/interval over the resources not paused: the posts a second they need."""
        with self._cache_lock:
            resources = list(self._cache.values())
        total = 0.0
        for resource in resources:
            spec = resource.get("spec") or {}
            if spec.get("paused") is True:
                continue
            try:
                total += 1.0 / interval_of(spec, self._ctx.min_interval)
            except ValueError:
                continue
        return max(RATE_FLOOR, total)


def key_of(resource: dict[str, Any]) -> Key:
    meta = resource["metadata"]
    return (meta["namespace"], meta["name"])
