"""One service = one action: validate a request, answer from stored results or the cache,
otherwise run the resource once (however often the request is delivered)."""

from __future__ import annotations

import fnmatch
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from functions import credentials, events, keys, protocol
from functions.errors import InvalidRequest, SinkRefused, Unavailable
from functions.ledger import results
from functions.logs import fields
from functions.metrics import Metrics, type_label
from functions.model import Action, HistoryPlan, Outcome, RepeatableGet, Request, Task
from functions.redaction import secret_values
from functions.replies import discovered_events, reply_event
from functions.runtimes import Runtime
from functions.service import checks, shared_check
from functions.service.cache_memory import CacheMemory
from functions.service.flights import Flights
from functions.service.request_data import parse_request_data
from functions.service.run_report import RunReport
from functions.service.teams import TEAM_ATTRIBUTE, check_team
from functions.settings import Settings
from functions.sink import post_events
from functions.steps.budget import async_lease_seconds
from functions.steps.outcome import final_failure
from functions.tracing import RunTracer, trace_context
from storage import Store
from storage.base import url_prefix
from storage.store_errors import StorageError

log = logging.getLogger("functions")


@dataclass(frozen=True)
class Reply:
    """What the HTTP layer sends: a status and, unless 202, a reply event."""

    status: int
    event: CloudEvent | None = None


class Service:
    def __init__(
        self,
        action: Action,
        settings: Settings,
        store: Store,
        runtime: Runtime,
        metrics: Metrics,
        provider: credentials.Provider | None = None,
    ) -> None:
        self.action = action
        self.provider = provider or credentials.make_provider(settings)
        self.settings = settings
        self.store = store
        self.runtime = runtime
        self.metrics = metrics
        self.flights = Flights()
        self.cache_memory = CacheMemory(settings.cache_recheck_seconds)
        tracer = RunTracer(f"resource-functions-{action}") if settings.tracing else None
        self.report = RunReport(action, store, metrics, tracer)

    def handle(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> Reply:
        """Serve one request event from ``sender`` (its authenticated identity). Raises
        ``InvalidRequest`` (400), ``TeamNotAllowed`` (403) or ``Unavailable`` (503)."""
        request = self.parse(event, sender)
        run = self.run_id(
            request.sender, request.build.team, request.event_source, request.event_id
        )
        self._log_request(
            request.event_id,
            request.event_source,
            run,
            request.type_name,
            request.resource_type.image,
        )
        try:
            resolved = self.resolve(request)
        except InvalidRequest:
            # A redelivery of a finished run replays its answer, even if a credential it
            # used has been deleted since; only a request that would run is refused.
            stored = results.read_outcome(self.store, run, request=request.digest)
            if stored is None:
                raise
            return self._reply(request, run, stored)
        try:
            return self._serve(resolved, run)
        except StorageError as err:
            # A permanent store refusal (e.g. a key the store will not take): final, not retried.
            return self._reply(request, run, final_failure(self.action, err))

    def run_id(self, sender: str, team: str, event_source: str, event_id: str) -> str:
        """The run of a request: ``keys.run_id`` under this deployment's key."""
        return keys.run_id(
            self.settings.cache_secret,
            sender=sender,
            team=team,
            event_source=event_source,
            event_id=event_id,
            action=self.action,
        )

    def repeatable(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> RepeatableGet | None:
        """What answers a repeat of this event from the cache memory (``answer_repeat``): a
        get without ``((var))`` references (those are looked up on each request). None for
        anything else; ``InvalidRequest`` as ``handle`` would raise it."""
        request = self.parse(event, sender)
        cache_key = self._cache_key(request)
        if cache_key is None:
            return None
        if credentials.find_references(request.source, request.params, request.version):
            return None
        return RepeatableGet(
            event_source=request.event_source,
            subject=request.subject,
            type_name=request.type_name,
            image=request.resource_type.image,
            cache_key=cache_key,
            sender=request.sender,
            team=request.build.team,
        )

    def answer_repeat(self, get: RepeatableGet, event_id: str) -> tuple[str, Outcome] | None:
        """A repeat of a ``repeatable`` get with this id, when the cache memory answers it
        without a look in the store: its run id and outcome, logged and counted as ``handle``
        would (its reply is ``reply_event``'s); None otherwise (``handle`` decides then)."""
        remembered = self.cache_memory.peek(get.cache_key)
        if remembered is None:
            return None
        run = self.run_id(get.sender, get.team, get.event_source, event_id)
        self._log_request(event_id, get.event_source, run, get.type_name, get.image, short_way=True)
        self.metrics.cache_hits.labels(self.action).inc()
        return run, Outcome(action=self.action, data=remembered)

    def _log_request(
        self,
        event_id: str,
        event_source: str,
        run: str,
        type_name: str | None,
        image: str,
        short_way: bool = False,
    ) -> None:
        """The request's line; ``short_way`` marks a repeat answered before the full way."""
        values: dict[str, object] = {
            "action": self.action,
            "id": event_id,
            "source": event_source,
            "run_id": run,
            "type": type_name,
            "image": image,
        }
        if short_way:
            values["short_way"] = True
        log.info("request", extra=fields(**values))

    def parse(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> Request:
        """The validated request; raises ``InvalidRequest``, or ``TeamNotAllowed`` for a team
        its sender may not name (``teams.check_team``): all before any lookup or run."""
        events.check_type(event, self.action)
        reply_async = self._wants_async(event)
        data = events.event_data(event)
        request = parse_request_data(
            data,
            action=self.action,
            event=event.get_attributes(),
            resource_types=self.settings.resource_types,
            artifact_url_prefix=url_prefix(self.store) + "artifacts/",
            reply_async=reply_async,
        )
        check_team(
            self.settings.sender_teams,
            enforced=bool(self.settings.sender_audience),
            sender=sender,
            team=request.build.team,
            attribute=event.get_extension(TEAM_ATTRIBUTE),
        )
        trace = trace_context(event.get_extension("traceparent"), event.get_extension("tracestate"))
        digest = keys.request_digest(
            self.settings.cache_secret, action=self.action, subject=request.subject, data=data
        )
        request = replace(request, trace=trace, sender=sender, digest=digest)
        image = request.resource_type.image
        if request.type_name is None and not any(
            fnmatch.fnmatchcase(image, pattern) for pattern in self.settings.allowed_images
        ):
            raise InvalidRequest(
                f"image {image!r} is not allowed here (ALLOWED_IMAGES); use a catalogue type"
            )
        return request

    def resolve(self, request: Request) -> Request:
        """The request with its ((var)) references resolved (after validation, before the
        cache key and the run). ``InvalidRequest`` names a variable that cannot be resolved;
        an unreachable provider raises ``Unavailable``."""
        resolved = credentials.resolve(
            self.provider,
            request.build,
            source=request.source,
            params=request.params,
            version=request.version,
        )
        if not resolved.values:
            return request
        return replace(
            request,
            source=resolved.source,
            params=resolved.params,
            version=resolved.version,
            secrets=resolved.values,
        )

    def _wants_async(self, event: CloudEvent) -> bool:
        asked: object = event.get_extension("replymode")
        if asked is None:
            # REPLY_MODE=async before the SinkBinding has injected K_SINK (the first revision
            # of a fresh install serves for a few seconds without it): reply in the HTTP
            # response, which a Trigger forwards to the Broker all the same.
            return self.settings.reply_mode == "async" and bool(self.settings.sink)
        if asked not in ("sync", "async"):
            raise InvalidRequest(f"replymode must be 'sync' or 'async', got {asked!r}")
        if asked == "async" and not self.settings.sink:
            raise InvalidRequest("replymode async needs K_SINK, which this service lacks")
        return asked == "async"

    def _serve(self, request: Request, run: str) -> Reply:
        cache_key = self._cache_key(request)
        remembered = self.cache_memory.fresh(cache_key) if cache_key else None
        if remembered is not None:
            # Ahead of this run's stored result: a hit starts nothing, and its reply has the
            # id a stored success of this run would have (only "cached" may differ).
            self.metrics.cache_hits.labels(self.action).inc()
            return self._reply(request, run, Outcome(action=self.action, data=remembered))
        plan = checks.history_plan(self.settings, request)
        fresh = None
        if plan is not None:
            request, fresh, age = checks.from_history(self.store, request, plan, time.time())
            if age is not None:
                self.metrics.check_age.labels(type_label(request.type_name)).observe(age)
        if request.reply_async:
            return self._start(request, run, cache_key, fresh)
        outcome, joined = self.flights.run(
            self._flight_keys(request, run, cache_key),
            lambda: self._answer(request, run, cache_key, fresh),
        )
        if joined:
            self.metrics.joined.labels(self.action).inc()
            # The run may have been another request's: record the answer under this request's
            # run id too, so its redelivery replays it instead of running again. Its versions
            # are announced by the request whose run found them, not again by each joiner.
            results.record_if_absent(self.store, run, outcome, request=request.digest)
        return self._reply(request, run, outcome, announce=not joined)

    def _start(
        self, request: Request, run: str, cache_key: str | None, fresh: Outcome | None
    ) -> Reply:
        """Asynchronous completion: 202 once the task is started (idempotent per run id), or
        the answer at once when there is one (stored, cached, fresh, another run's check)."""
        stored = self._stored_answer(request, run, cache_key) or self._fresh(request, run, fresh)
        if stored is not None:
            return self._reply(request, run, stored)
        task = self._task(request, run, cache_key)
        if task.history is not None and self.settings.check_lease_seconds > 0:
            return self._start_once(request, task, task.history)
        self._begin(task, request.type_name)
        return Reply(status=202)

    def _begin(self, task: Task, type_name: str | None) -> None:
        """Start an asynchronous run; it is reported when the runtime sees it end."""
        began = self.report.began(task, type_name)
        self.runtime.start(task, ended=lambda outcome: self.report.ended(task, began, outcome))

    def _start_once(self, request: Request, task: Task, plan: HistoryPlan) -> Reply:
        """An asynchronous check shared across replicas through its resource's lease: start
        its task holding the lease (the task releases it), or wait for the run of the
        replica holding it and answer in the HTTP response. Not a 202: a waiter has no task
        of its own to post its reply later, and the replica that would post it may be
        scaled down before the holder's run ends."""
        # Nobody renews a task's lease: it lasts the task's whole budget, and a waiter may
        # wait that long for the holder's task.
        ttl = async_lease_seconds(task.timeout_seconds, self.settings.task_margin_seconds)
        outcome, _ = shared_check.start_or_wait(
            self.store,
            keys.lease_record_key(plan.resource_key),
            run=task.run_id,
            ttl=ttl,
            timeout=ttl,
            start=lambda held: self._begin(replace(task, lease=held), request.type_name),
        )
        if outcome is None:
            return Reply(status=202)
        return self._reply(request, task.run_id, self._joined(request, task, plan, outcome))

    def _answer(
        self, request: Request, run: str, cache_key: str | None, fresh: Outcome | None
    ) -> Outcome:
        """Inside the flight, so a redelivery arriving as a run ends sees its result."""
        stored = self._stored_answer(request, run, cache_key) or self._fresh(request, run, fresh)
        if stored is not None:
            return stored
        task = self._task(request, run, cache_key)
        if task.history is None or self.settings.check_lease_seconds <= 0:
            return self._run(task, request.type_name)
        return self._check_once(request, task, task.history)

    def _check_once(self, request: Request, task: Task, plan: HistoryPlan) -> Outcome:
        """A check shared across replicas through its resource's lease: run it, or wait for
        the run of the replica holding the lease and answer from it. A waiter's answer is
        stored under its own run id, so its redelivery replays it."""
        holding = False

        def work() -> Outcome:
            nonlocal holding
            holding = True
            self.metrics.lease_waiters.dec()
            with self.metrics.leases_held.track_inprogress():
                return self._run(task, request.type_name)

        self.metrics.lease_waiters.inc()  # until it holds the lease, or the holder's run ends
        try:
            outcome, holder = shared_check.run_or_wait(
                self.store,
                keys.lease_record_key(plan.resource_key),
                run=task.run_id,
                ttl=self.settings.check_lease_seconds,
                timeout=task.timeout_seconds,
                work=work,
            )
        finally:
            if not holding:
                self.metrics.lease_waiters.dec()
        if holder == task.run_id:  # our run, or our own earlier delivery's on another replica
            return outcome
        return self._joined(request, task, plan, outcome)

    def _joined(self, request: Request, task: Task, plan: HistoryPlan, shared: Outcome) -> Outcome:
        """A check's answer from another run of its resource, stored under its own run id so
        that its redelivery replays it."""
        self.metrics.joined.labels(self.action).inc()
        answer = checks.joined_answer(self.store, request, plan, shared)
        return results.record_outcome(self.store, task.run_id, answer, request=request.digest)

    def _fresh(self, request: Request, run: str, fresh: Outcome | None) -> Outcome | None:
        """A check answered from the history (within its interval), recorded as this run's
        result so that a redelivery replays it, whatever the history says by then."""
        if fresh is None:
            return None
        self.metrics.cache_hits.labels(self.action).inc()
        return results.record_outcome(self.store, run, fresh, request=request.digest)

    def _stored_answer(self, request: Request, run: str, cache_key: str | None) -> Outcome | None:
        """The stored result of this run (redelivery), or a get's cache entry."""
        stored = results.read_outcome(self.store, run, request=request.digest)
        if stored is not None:
            self.metrics.joined.labels(self.action).inc()
            return stored
        if cache_key is None:
            return None
        cached = self._read_cache(cache_key)
        if cached is None:
            self.metrics.cache_misses.labels(self.action).inc()
            return None
        self.metrics.cache_hits.labels(self.action).inc()
        return Outcome(action=self.action, data=cached)

    def _read_cache(self, cache_key: str) -> dict[str, Any] | None:
        """The cache entry, its record from memory if kept, its artifact looked for."""
        cached = results.read_cache(self.store, cache_key, self.cache_memory.record(cache_key))
        if cached is None:
            self.cache_memory.forget(cache_key)
        else:
            self.cache_memory.seen(cache_key, cached)
        return cached

    def _run(self, task: Task, type_name: str | None) -> Outcome:
        began = self.report.began(task, type_name)
        outcome = self.runtime.run(task)
        self.report.ended(task, began, outcome)
        return outcome

    def _cache_key(self, request: Request) -> str | None:
        if request.action != "get":
            return None
        return keys.cache_key(
            self.settings.cache_secret,
            image=request.resource_type.image,
            source=request.source,
            version=request.version,
            params=request.params,
        )

    def _flight_keys(self, request: Request, run: str, cache_key: str | None) -> list[str]:
        """Identical checks and gets arriving together share one run. A redelivery joins its
        run by run id and digest: another request reusing the run id never joins it (its
        runtime refuses it when it finds the run's container or Job)."""
        flight = [f"{run}:{request.digest}"]
        if cache_key:
            flight.append(f"get:{cache_key}")
        elif request.action == "check":
            flight.append(
                "check:"
                + keys.cache_key(
                    self.settings.cache_secret,
                    image=request.resource_type.image,
                    source=request.source,
                    version=request.version,
                    params={},
                    action="check",
                )
            )
        return flight

    def _task(self, request: Request, run: str, cache_key: str | None) -> Task:
        # TASK_TIMEOUT_SECONDS is this service's ceiling (it must fit its request timeout);
        # a resource type may only lower it.
        timeout = min(
            request.resource_type.timeout_seconds or math.inf, self.settings.task_timeout_seconds
        )
        return Task(
            run_id=run,
            action=request.action,
            resource_type=request.resource_type,
            stdin=protocol.stdin_payload(
                request.action, request.source, request.version, request.params
            ),
            env=protocol.build_env(request.action, request.build, request.trace),
            inputs=request.inputs,
            cache_key=cache_key,
            timeout_seconds=timeout,
            request_id=request.event_id,
            request_source=request.event_source,
            subject=request.subject,
            secrets=secret_values(
                source=request.source,
                params=request.params,
                resolved=request.secrets,
                keys=self.settings.redact_keys,
            ),
            resolved=request.secrets,
            history=checks.history_plan(self.settings, request),
            trace=request.trace,
            request_digest=request.digest,
            team=request.build.team,
        )

    def _reply(self, request: Request, run: str, outcome: Outcome, announce: bool = True) -> Reply:
        """The reply; ``announce``: post the check's discovered versions first (the request
        whose run added them to the history does; a joiner of its run does not)."""
        if announce:
            self._post_discoveries(request, run, outcome)
        event = reply_event(
            action=self.action,
            outcome=outcome,
            request_id=request.event_id,
            subject=request.subject,
            run_id=run,
            trace=request.trace,
        )
        return Reply(status=200, event=event)

    def _post_discoveries(self, request: Request, run: str, outcome: Outcome) -> None:
        """A check's ``version.discovered`` events go to K_SINK (the HTTP response holds the
        reply alone). Without K_SINK they are not sent: the reply's ``new`` lists the same
        versions. A sink that refuses them is a 503: the redelivery replays the stored result
        and posts the same events (their ids derive from the resource and the version) again."""
        plan: HistoryPlan | None = checks.history_plan(self.settings, request)
        found = discovered_events(
            outcome=outcome,
            request_id=request.event_id,
            subject=request.subject,
            run_id=run,
            history=plan,
            trace=request.trace,
        )
        if not found or not self.settings.sink:
            return
        try:
            post_events(self.settings.sink, found)
        except SinkRefused as err:
            raise Unavailable(f"cannot post the version.discovered events: {err}") from err
