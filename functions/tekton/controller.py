"""The controller's shell around ``decide``: a knative/client-go style reconciler.

- A LIST and WATCH of CustomRuns cluster-wide keeps a cache of this project's (latest seen),
  and puts each changed one's key ``(namespace, name)`` on a work queue (``work_queue.py``):
  deduped, never to two workers at once, retried with backoff.
- A few workers reconcile one key each: ``decide`` on the cached object, stop and write the
  status (guarded by its resourceVersion; a conflict re-reads and retries), then, outside the
  key's lock, hand the request to a poster, write an Event on the CustomRun, and queue the key
  again for its next look (a deadline, a due re-post). Any exception is that CustomRun's
  alone: logged, counted, retried with backoff; the others go on.
- Posts (requests, and the stops of attempts that ended) run on their own threads
  (``POST_THREADS``): the in-memory channel holds a post until it has delivered the event,
  through all its retries, and meanwhile the key stays free, so a cancel is taken at once and
  its stop reaches the functions before the request's next delivery does.
- A running attempt's request is posted again on a growing schedule (``REPOST_FIRST`` doubling
  to ``REPOST_MAX``): the functions attach it to the run under way, or answer it from the
  stored result, so a lost reply completes the run anyway.
- Replies (``reply``, from the receiver) are applied under the key's lock, on any replica.
- With a ``LeaderElection``, only the replica holding the Lease watches and reconciles; a
  leader that loses it stops (the process exits, and starts again as a follower).

It keeps no annotations, finalizers or state of its own in the cluster (docs/tekton.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from functions.bounded_cache import BoundedCache
from functions.errors import Conflict, NotFound, SinkRefused, Unavailable
from functions.kube.objects import ListEnd, Undecodable
from functions.kube.tekton_api import DONE_MARK, OWNER_MARKS, TektonApi
from functions.sink import post_reply
from functions.tekton import status as st
from functions.tekton.controller_config import ControllerConfig
from functions.tekton.controller_metrics import ControllerMetrics
from functions.tekton.decide import (
    Context,
    Posting,
    Reply,
    Step,
    deadline_of,
    decide,
    on_reply,
    refused,
)
from functions.tekton.leader import LeaderElection
from functions.tekton.namespace_teams import NamespaceTeams
from functions.tekton.params import API_VERSION, is_ours
from functions.tekton.work_queue import KeyLocks, WorkQueue, workers

REPOST_SECONDS = 5.0  # a request the Broker did not take is posted again this soon
FINAL_REFUSALS = frozenset({400, 401, 403})  # the Broker will never take this post
REPOST_FIRST = 60.0  # a running attempt's request is posted again after this, doubling ...
REPOST_MAX = 600.0  # ... up to this
CONFLICT_TRIES = 5
OVERDUE_SECONDS = 60.0
WORKERS = 3
POST_THREADS = 8  # posts under way at once: a slow ingress holds a poster, never a key
REPORTED = 4096  # undecodable CustomRun versions remembered as reported
log = logging.getLogger("functions.tekton")
Key = tuple[str, str]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Reposts:
    """When the attempt ``request_id`` of a key is due to be posted again."""

    request_id: str
    due: float  # monotonic
    interval: float


class Controller:
    def __init__(
        self,
        api: TektonApi,
        config: ControllerConfig,
        teams: NamespaceTeams,
        *,
        clock: Callable[[], datetime] = utcnow,
        metrics: ControllerMetrics | None = None,
        workers: int = WORKERS,
        repost_first: float = REPOST_FIRST,
    ) -> None:
        self._api = api
        self._config = config
        self._clock = clock
        self.teams = teams
        self._ctx = Context(
            event_source=config.event_source,
            team_of=teams.team_of,
            resource_types=config.resource_types,
            artifact_url_prefix=config.artifact_url_prefix,
            refusal=teams.refusal,
            allowed_images=config.allowed_images,
        )
        self.queue = WorkQueue()
        self._cache: dict[Key, dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._locks = KeyLocks()
        self._reposts: dict[Key, Reposts] = {}
        self._posts = ThreadPoolExecutor(POST_THREADS, thread_name_prefix="tekton-post")
        self._posting: set[str] = set()  # request ids whose post is under way
        self._reported: BoundedCache[tuple[str, str], bool] = BoundedCache(REPORTED)
        self._workers = workers
        self._repost_first = repost_first
        self.metrics = metrics or ControllerMetrics()
        self.metrics.watch(self.queue.depth, self.overdue)
        self.stopped = threading.Event()
        self.lost_lead = False

    # --- running ------------------------------------------------------------------------------

    def run(
        self,
        leader: LeaderElection | None = None,
        alongside: Callable[[threading.Event], None] | None = None,
    ) -> None:
        """Reconcile until ``stopped`` is set (or the Lease is lost): workers in threads, the
        LIST and WATCH here; ``alongside(stopped)`` in a thread of its own while leading (the
        Resources' scheduler)."""
        if leader is not None:
            if not leader.acquire(self.stopped):
                return
            leader.keep(self.stopped, self._lose_lead)
        self.metrics.leader.set(1)
        if alongside is not None:
            threading.Thread(
                target=alongside, args=(self.stopped,), name="alongside", daemon=True
            ).start()
        try:
            with workers(self._work, self._workers, "tekton-worker", self.queue):
                while not self.stopped.is_set():
                    try:
                        self.list_and_watch()
                    except Exception:  # the API away: take it up again from a fresh LIST
                        log.exception("customrun watch failed; listing again")
                        self.stopped.wait(2)
        finally:
            self.metrics.leader.set(0)
            self._posts.shutdown(wait=False, cancel_futures=True)

    def _lose_lead(self) -> None:
        self.lost_lead = True
        self.stopped.set()

    def list_and_watch(self) -> None:
        ours: dict[Key, dict[str, Any]] = {}
        version = ""
        for found in self._api.list_customruns():  # a page at a time, each object alone
            if isinstance(found, ListEnd):
                version = found.resource_version
            elif isinstance(found, Undecodable):
                self._undecodable(found)
            elif is_ours(found):
                ours[key_of(found)] = found
        with self._cache_lock:
            gone = set(self._cache) - set(ours)
            self._cache = ours
        for key in gone:
            self._forget(key)
        for key in ours:
            self.queue.add(key)
        for kind, obj in self._api.watch_customruns(version, int(self._config.resync_seconds)):
            if self.stopped.is_set():
                return
            if kind == "ERROR":  # 410 Gone and friends: list again
                return
            if kind == "BOOKMARK":
                continue
            if isinstance(obj, Undecodable):
                self._undecodable(obj, kind == "DELETED")
                continue
            if not is_ours(obj):
                continue
            key = key_of(obj)
            if kind == "DELETED":
                self._drop(key)
                continue
            self._remember(obj)
            self.queue.add(key)

    def _work(self) -> None:
        while not self.stopped.is_set():
            key = self.queue.get(1.0)
            if key is None:
                continue
            started = time.monotonic()
            try:
                self.reconcile(key)  # type: ignore[arg-type]
                self.queue.forget(key)
            except Exception as err:  # noqa: BLE001 - one CustomRun's failure is its own
                self._failed(key, err)  # type: ignore[arg-type]
            finally:
                self.queue.done(key)
                self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    def _failed(self, key: Key, err: Exception) -> None:
        reason = (
            "conflict"
            if isinstance(err, Conflict)
            else "unavailable"
            if isinstance(err, Unavailable)
            else "error"
        )
        self.metrics.failures.labels(reason).inc()
        if isinstance(err, Conflict):
            self._refresh(key)
        delay = self.queue.retry(key)
        if reason == "error":
            log.exception("customrun %s/%s: reconcile failed; again in %.1fs", *key, delay)
        else:
            log.warning("customrun %s/%s: %s; again in %.1fs", *key, err, delay)

    # --- one CustomRun ------------------------------------------------------------------------

    def reconcile(self, key: Key) -> None:
        """Decide on the cached CustomRun and act on it (raises ``Conflict`` when its status
        changed meanwhile: the caller retries from a fresh read)."""
        with self._locks.held(key):
            run = self._cached(key)
            if run is None:
                return
            step = decide(run, self._clock(), self._ctx)
            written = self._settle(run, step)
        self._follow(key, written, step)

    def reply(self, namespace: str, name: str, reply: Reply) -> None:
        """A reply event for CustomRun ``namespace/name``: applied, or dropped when stale or
        not bound to the run. Raises when the status could not be written (the receiver
        answers 503: Knative delivers the reply again)."""
        key = (namespace, name)
        for _ in range(CONFLICT_TRIES):
            with self._locks.held(key):
                run = self._cached(key)
                if run is None:
                    self.metrics.replies.labels("stale").inc()
                    return
                step = on_reply(run, reply, self._clock(), self._ctx)
                try:
                    written = self._settle(run, step)
                    break
                except Conflict:
                    self._refresh(key)
        else:
            self.metrics.replies.labels("not_written").inc()
            raise RuntimeError(f"customrun {namespace}/{name} kept changing; reply not applied")
        outcome = "dropped" if step.dropped else "applied" if step.status else "stale"
        self.metrics.replies.labels(outcome).inc()
        if step.dropped:
            log.warning("customrun %s/%s: reply dropped: %s", namespace, name, step.dropped)
            self._event(written, True, "ReplyDropped", step.dropped)
        self._follow(key, written, step)

    def _settle(self, run: dict[str, Any], step: Step) -> dict[str, Any]:
        """Under the key's lock: stop the attempt that ended, write the status; the object as
        it is now (as written, or as it was)."""
        if step.stop is not None:  # a refusal is logged and counted; the run ends all the same
            self._posts.submit(self._post, step.stop)
        if step.status is None:
            return run
        try:
            written = self._api.replace_status(run, step.status)
        except NotFound:
            return run
        self._remember(written)
        before = st.condition_of(run.get("status") or {}) or {}
        after = st.condition_of(step.status) or {}
        if (before.get("status"), before.get("reason")) != (
            after.get("status"),
            after.get("reason"),
        ):
            self.metrics.transitions.labels(str(after.get("reason"))).inc()
            log.info("customrun %s: %s %s", name_of(run), after.get("status"), after.get("reason"))
        return written

    def _follow(self, key: Key, run: dict[str, Any], step: Step) -> None:
        """Outside the lock: post the request (the in-memory channel answers a post once it has
        delivered it, and a cache hit's reply comes back to ``reply`` within that delivery), an
        Event for a transition, and the key's next look."""
        if step.status is not None:
            found = st.condition_of(step.status) or {}
            failed = found.get("status") == "False" or found.get("reason") == st.RETRYING
            self._event(run, failed, str(found.get("reason")), str(found.get("message") or ""))
        if st.is_done(run.get("status") or {}):
            self._reposts.pop(key, None)
            return
        if step.post is not None:
            self._post_when_due(key, step.post)
        if step.wake_at is not None:
            self.queue.add_after(key, (step.wake_at - self._clock()).total_seconds())

    def _post_when_due(self, key: Key, posting: Posting) -> None:
        now = time.monotonic()
        known = self._reposts.get(key)
        if known is not None and known.request_id == posting.request_id and now < known.due:
            self.queue.add_after(key, known.due - now)
            return
        with self._cache_lock:
            if posting.request_id in self._posting:
                return  # the post under way queues the key's next look when it ends
            self._posting.add(posting.request_id)
        self._posts.submit(self._post_then_look, key, posting, known)

    def _post_then_look(self, key: Key, posting: Posting, known: Reposts | None) -> None:
        """On a poster: post, then queue the key's next look (a refusal for good ends the
        run); a failure here is logged and the key looks again soon."""
        try:
            refusal = self._post(posting)
        except Exception:
            log.exception("posting request %s failed", posting.request_id)
            self.queue.add_after(key, REPOST_SECONDS)
            return
        finally:
            with self._cache_lock:
                self._posting.discard(posting.request_id)
        if refusal is not None:
            if refusal.status in FINAL_REFUSALS:
                self._end_refused(key, posting, str(refusal))
            else:
                self.queue.add_after(key, REPOST_SECONDS)
            return
        with self._cache_lock:
            run = self._cache.get(key)
        if run is None or st.is_done(run.get("status") or {}):
            return  # ended while its request was posted: nothing to post again
        interval = (
            self._repost_first
            if known is None or known.request_id != posting.request_id
            else min(known.interval * 2, REPOST_MAX)
        )
        self._reposts[key] = Reposts(posting.request_id, time.monotonic() + interval, interval)
        self.queue.add_after(key, interval)

    def _post(self, posting: Posting) -> SinkRefused | None:
        """Post ``posting``'s request; the refusal, if the Broker did not take it."""
        event = CloudEvent(attributes=posting.attributes, data=posting.data)
        try:
            post_reply(self._config.broker, event, attempts=3, timeout=30)
        except SinkRefused as err:
            self.metrics.posts.labels("refused").inc()
            log.warning("request %s not posted: %s", posting.request_id, err)
            return err
        self.metrics.posts.labels("posted").inc()
        log.info("request %s posted (%s)", posting.request_id, posting.attributes["type"])
        return None

    def _end_refused(self, key: Key, posting: Posting, why: str) -> None:
        """End the run: the Broker will never take its request (no policy for its team)."""
        message = (
            f"the Broker refused the request for good ({why}): is team "
            f"{posting.attributes.get('team')!r} among the controller's EventPolicy's teams?"
        )
        with self._locks.held(key):
            run = self._cached(key)
            if run is None:
                return
            step = refused(run, posting.request_id, message, self._clock())
            written = self._settle(run, step)
        self._follow(key, written, step)

    def _event(self, run: dict[str, Any], warning: bool, reason: str, message: str) -> None:
        try:
            self._api.event(run, warning, reason, message)
        except Exception as err:  # noqa: BLE001 - an Event is for people: never worth a retry
            log.info("no Event on customrun %s: %s", name_of(run), err)

    # --- the cache ----------------------------------------------------------------------------

    def _cached(self, key: Key) -> dict[str, Any] | None:
        with self._cache_lock:
            found = self._cache.get(key)
        return found if found is not None else self._refresh(key)

    def _refresh(self, key: Key) -> dict[str, Any] | None:
        found = self._api.read_customrun(*key)
        if isinstance(found, Undecodable):
            self._undecodable(found)
            return None
        if found is None:
            with self._cache_lock:
                self._cache.pop(key, None)
            return None
        self._remember(found)
        return found

    def _undecodable(self, found: Undecodable, deleted: bool = False) -> None:
        """A CustomRun that cannot be decoded within the bounds: out of the cache and the
        queue, like a deleted one; if it is ours and not done, reported once per version (a
        log line, the metric, an Event) and ended failed, so that its PipelineRun goes on. A
        done one is left unreported: so the version our own patch makes, and a re-LIST after
        a restart, are not reported twice. Every other CustomRun is untouched."""
        key = (found.namespace, found.name)
        self._drop(key)
        owner = {found.marks.get(mark) for mark in OWNER_MARKS}
        seen = (found.uid, found.resource_version)
        done = found.marks.get(DONE_MARK)
        if deleted or done or API_VERSION not in owner or self._reported.get(seen):
            return
        self._reported.put(seen, True)
        self.metrics.undecodable.labels(found.limit).inc()
        message = (
            f"the controller cannot read this CustomRun: it is {found.reason} "
            f"(its params are bounded far below: docs/tekton.md); it is skipped"
        )
        log.warning("customrun %s/%s: %s", *key, message)
        stub = {
            "metadata": {
                "namespace": found.namespace,
                "name": found.name,
                "uid": found.uid,
                "resourceVersion": found.resource_version,
            }
        }
        self._event(stub, True, st.UNDECODABLE, message)
        try:
            self._api.patch_status(
                stub, st.finished({}, False, st.UNDECODABLE, message, self._clock())
            )
        except Exception as err:  # noqa: BLE001 - changed or gone meanwhile: its next version is seen
            log.info("customrun %s/%s: not ended: %s", *key, err)

    def _remember(self, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        with self._cache_lock:
            known = self._cache.get(key)
            if known is None or newer(obj, known):
                self._cache[key] = obj

    def _drop(self, key: Key) -> None:
        """Out of the cache and the queue: gone, or not to be reconciled."""
        with self._cache_lock:
            self._cache.pop(key, None)
        self._forget(key)

    def _forget(self, key: Key) -> None:
        self.queue.forget(key)
        self._reposts.pop(key, None)

    def overdue(self) -> int:
        """Running attempts of the cache more than ``OVERDUE_SECONDS`` past their deadline."""
        now = self._clock()
        with self._cache_lock:
            runs = list(self._cache.values())
        late = 0
        for run in runs:
            status = run.get("status") or {}
            if st.is_done(status) or not status.get("startTime"):
                continue
            try:
                deadline = deadline_of(run, st.parse_time(status["startTime"]))
            except ValueError:
                continue
            if deadline is not None and (now - deadline).total_seconds() > OVERDUE_SECONDS:
                late += 1
        return late


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def name_of(run: Mapping[str, Any]) -> str:
    return "/".join(key_of(run))


def newer(obj: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a later version than ``than`` (resourceVersions are opaque, but a
    written object's and a watch's later one are larger numbers on every API server here;
    an unparsable one counts as newer)."""
    try:
        mine = int((obj.get("metadata") or {}).get("resourceVersion") or 0)
        theirs = int((than.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return True
    return mine >= theirs
