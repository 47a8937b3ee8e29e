"""The reconcile loop: LIST and WATCH CustomRuns cluster-wide, act on what ``decide`` says,
wake at each attempt's deadline, and take the replies the receiver hands over.

A plain client watch loop, not kopf (docs/tekton.md says why): every decision is derived
from the CustomRun, so the controller keeps no annotations, finalizers or state of its own,
and a restart takes up every run from a fresh LIST (re-posting the running ones' requests,
which the functions attach to the runs under way). Status is written with ``replace`` and
the object's resourceVersion: a write that raced another is redone from a fresh read.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from cloudevents.core.v1.event import CloudEvent
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from functions import keys
from functions.errors import SinkRefused
from functions.runtimes.kube_api import KubeApi
from functions.runtimes.podspec import REQUEST_LABEL
from functions.sink import post_reply
from functions.tekton.controller_config import ControllerConfig
from functions.tekton.decide import Context, Posting, Reply, Step, decide, on_reply
from functions.tekton.namespace_teams import NamespaceTeams

GROUP, VERSION, PLURAL = "tekton.dev", "v1beta1", "customruns"
REPOST_SECONDS = 5.0  # a request the Broker did not take is posted again this soon
CONFLICT_TRIES = 5
log = logging.getLogger("functions.tekton")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Controller:
    def __init__(
        self,
        api_client: Any,
        config: ControllerConfig,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._objects = client.CustomObjectsApi(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._config = config
        self._clock = clock
        kube = KubeApi(api_client, config.task_namespace, (5.0, 30.0))
        self.teams = NamespaceTeams(config.teams, kube.namespace_labels)
        self._ctx = Context(
            event_source=config.event_source,
            team_of=self.teams.team_of,
            resource_types=config.resource_types,
            artifact_url_prefix=config.artifact_url_prefix,
            refusal=self.teams.refusal,
        )
        self._lock = threading.RLock()  # one decision at a time: watch, timers, replies
        self._posted: set[str] = set()  # request ids this process has posted
        self._wakes: list[tuple[datetime, str, str]] = []
        self._pending: set[tuple[datetime, str, str]] = set()
        self._woken = threading.Condition()
        self.stopped = threading.Event()

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile until ``stopped`` is set: timers in a thread, LIST+WATCH here."""
        timers = threading.Thread(target=self._run_timers, name="tekton-timers", daemon=True)
        timers.start()
        while not self.stopped.is_set():
            try:
                self.list_and_watch()
            except Exception:  # the API away: take it up again from a fresh LIST
                log.exception("customrun watch failed; listing again")
                self.stopped.wait(2)

    def list_and_watch(self) -> None:
        listed = cast(
            dict[str, Any], self._objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        )
        for item in listed.get("items") or []:
            self.reconcile(item)
        version = (listed.get("metadata") or {}).get("resourceVersion")
        stream = watch.Watch()
        for event in stream.stream(
            self._objects.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=int(self._config.resync_seconds),
        ):
            if self.stopped.is_set():
                stream.stop()
                return
            kind, obj = event.get("type"), event.get("object")
            if kind in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                self.reconcile(obj)
            elif kind == "ERROR":  # 410 Gone and friends: list again
                return

    def reconcile(self, run: Mapping[str, Any]) -> None:
        for _ in range(CONFLICT_TRIES):
            with self._lock:
                try:
                    step = decide(run, self._clock(), self._ctx)
                    self._settle(run, step)
                    break
                except _Conflict:
                    fresh = self._read(run["metadata"]["namespace"], run["metadata"]["name"])
                    if fresh is None:
                        return
                    run = fresh
        else:
            log.warning("customrun %s kept changing under the controller", _name(run))
            return
        self._follow(run, step)

    def reply(self, namespace: str, name: str, reply: Reply) -> None:
        """A reply event for CustomRun ``namespace/name``: applied, or dropped when stale.
        Raises when the status could not be written (the receiver answers 503: Knative
        delivers the reply again)."""
        for _ in range(CONFLICT_TRIES):
            with self._lock:
                run = self._read(namespace, name)
                if run is None:
                    return
                try:
                    step = on_reply(run, reply, self._clock(), self._ctx)
                    if step.dropped:
                        log.warning("customrun %s: reply dropped: %s", _name(run), step.dropped)
                    self._settle(run, step)
                    break
                except _Conflict:
                    continue
        else:
            raise RuntimeError(f"customrun {namespace}/{name} kept changing; reply not applied")
        self._follow(run, step)

    # --- effects ----------------------------------------------------------------------------

    def _settle(self, run: Mapping[str, Any], step: Step) -> None:
        """Under the lock: stop the attempt's Job, write the status."""
        if step.stop:
            self._stop(step.stop)
        if step.status is not None:
            self._write_status(run, step.status)
            log.info("customrun %s: %s", _name(run), _summary(step.status))

    def _follow(self, run: Mapping[str, Any], step: Step) -> None:
        """Outside the lock: post the request, set the next look. A post can wait on the
        Broker until the request is delivered (the in-memory channel fans out before it
        answers), and a cache hit's reply comes back to ``reply`` within that delivery: the
        lock held here would make them wait on each other until the post timed out."""
        meta = run["metadata"]
        if step.post is not None and step.post.request_id not in self._posted:
            if self._post(step.post):
                self._posted.add(step.post.request_id)
            else:
                self._wake(meta["namespace"], meta["name"], None)
        if step.wake_at is not None:
            self._wake(meta["namespace"], meta["name"], step.wake_at)

    def _write_status(self, run: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = run["metadata"]
        body = {**run, "status": status}
        try:
            self._objects.replace_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body
            )
        except ApiException as err:
            if err.status == 409:
                raise _Conflict() from err
            if err.status == 404:
                return
            raise

    def _post(self, posting: Posting) -> bool:
        event = CloudEvent(attributes=posting.attributes, data=posting.data)
        try:
            post_reply(self._config.broker, event, attempts=3, timeout=30)
        except SinkRefused as err:
            log.warning("request %s not posted: %s", posting.request_id, err)
            return False
        log.info("request %s posted (%s)", posting.request_id, posting.attributes["type"])
        return True

    def _stop(self, request_id: str) -> None:
        """Delete the task Job of request ``request_id`` (found by its label): cancelled or
        timed out, the run stops. Its reply, if any, comes to a finished attempt: dropped."""
        if not self._config.task_namespace:
            return
        label = keys.request_label(self._config.event_source, request_id)
        try:
            self._batch.delete_collection_namespaced_job(
                self._config.task_namespace,
                label_selector=f"{REQUEST_LABEL}={label}",
                propagation_policy="Background",
            )
        except ApiException as err:
            log.warning("cannot delete the Job of request %s: %s", request_id, err.reason)

    def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = cast(
                dict[str, Any],
                self._objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    # --- deadlines --------------------------------------------------------------------------

    def _wake(self, namespace: str, name: str, at: datetime | None) -> None:
        entry = (at or self._clock() + timedelta(seconds=REPOST_SECONDS), namespace, name)
        with self._woken:
            if entry not in self._pending:  # each watch event names the same deadline again
                self._pending.add(entry)
                heapq.heappush(self._wakes, entry)
                self._woken.notify()

    def _run_timers(self) -> None:
        while not self.stopped.is_set():
            with self._woken:
                now = self._clock()
                due = []
                while self._wakes and self._wakes[0][0] <= now:
                    due.append(heapq.heappop(self._wakes))
                    self._pending.discard(due[-1])
                if not due:
                    left = (self._wakes[0][0] - now).total_seconds() if self._wakes else 1.0
                    self._woken.wait(min(max(left, 0.05), 1.0))
                    continue
            for _, namespace, name in sorted(set(due)):
                try:
                    found = self._read(namespace, name)
                    if found is not None:
                        self.reconcile(found)
                except Exception:
                    log.exception("customrun %s/%s: deadline check failed", namespace, name)
                    self._wake(namespace, name, None)


class _Conflict(Exception):
    """The status write met a newer version of the object."""


def _name(run: Mapping[str, Any]) -> str:
    return f"{run['metadata']['namespace']}/{run['metadata']['name']}"


def _summary(status: dict[str, Any]) -> str:
    found = (status.get("conditions") or [{}])[0]
    return f"{found.get('status')} {found.get('reason')}"
