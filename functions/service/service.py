"""One service = one action: validate a request, answer from stored results or the cache,
otherwise run the resource once (however often the request is delivered)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from cloudevents.core.v1.event import CloudEvent

from functions import credentials, keys
from functions.errors import InvalidRequest
from functions.ledger import results, tombstones
from functions.logs import fields
from functions.metrics import Metrics, type_label
from functions.model import Action, Outcome, RepeatableGet, Request, Task
from functions.runtimes import Runtime
from functions.service import checks, intake, shared_check
from functions.service.answer_event import post_discoveries, reply_of
from functions.service.answers import Answer, Answers
from functions.service.artifact_teams import ArtifactTeams, check_inputs
from functions.service.cache_memory import CacheMemory
from functions.service.call import Call, cache_key, make_call, task, with_request
from functions.service.config import ServiceConfig
from functions.service.flights import Flights
from functions.service.run_report import RunReport, log_request
from functions.service.stop_requests import Stop, is_stop, parse_stop
from functions.service.team_runs import TeamRuns
from functions.steps.budget import async_lease_seconds
from functions.steps.outcome import final_failure
from functions.tracing import RunTracer
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
        config: ServiceConfig,
        store: Store,
        runtime: Runtime,
        metrics: Metrics,
        provider: credentials.Provider,
    ) -> None:
        self.action = action
        self.config = config
        self.provider = provider
        self.store = store
        self.runtime = runtime
        self.metrics = metrics
        self.flights = Flights()
        tracer = RunTracer(f"resource-functions-{action}") if config.tracing else None
        self.report = RunReport(action, store, metrics, tracer)
        self.answers = Answers(action, store, metrics, CacheMemory(config.cache_recheck_seconds))
        self.artifact_teams = ArtifactTeams(store)
        self.team_runs = TeamRuns(config.max_runs_per_team)

    @property
    def cache_memory(self) -> CacheMemory:
        """What this replica remembers of the get cache (``Answers`` keeps it up to date)."""
        return self.answers.cache_memory

    def handle(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> Reply:
        """Serve one request event (or a stop of one) from ``sender`` (its authenticated identity). Raises
        ``InvalidRequest`` (400), ``TeamNotAllowed`` (403) or ``Unavailable`` (503)."""
        if is_stop(event):
            return self.stop(parse_stop(event, sender, action=self.action, config=self.config))
        request = self.parse(event, sender)
        run = self.run_id(
            request.sender, request.build.team, request.event_source, request.event_id
        )
        log_request(self.action, request.event_id, request.event_source, run, request)
        if request.inputs:  # before any lookup or run
            check_inputs(self.store, request.inputs, request.build.team)
        try:
            resolved = intake.resolve(self.provider, request)
        except InvalidRequest:
            # A redelivery of a finished run replays its answer, even if a credential it
            # used has been deleted since; only a request that would run is refused.
            stored = results.read_outcome(self.store, run, request=request.digest)
            if stored is None:
                raise
            return self._reply(make_call(self.config, request, run), stored)
        call = make_call(self.config, resolved, run)
        try:
            return self._serve(call)
        except StorageError as err:
            # A permanent store refusal (e.g. a key the store will not take): final, not retried.
            return self._reply(call, final_failure(self.action, err))

    def stop(self, stop: Stop) -> Reply:
        """Mark the run stopped, then stop what runs for it (``functions.service.stop_requests``)."""
        run = self.run_id(stop.sender, stop.team, stop.event_source, stop.stops)
        tombstones.record(self.store, run)
        self.metrics.stops.labels(self.action).inc()
        log.info(
            "request stopped by its sender",
            extra=fields(action=self.action, id=stop.stops, source=stop.event_source, run_id=run),
        )
        self.runtime.stop(run, self.action)  # Unavailable: 503, and the stop comes again
        return Reply(status=200)

    def parse(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> Request:
        """The validated request (``intake.parse``): all before any lookup or run."""
        artifacts = keys.artifacts_url_prefix(url_prefix(self.store))
        return intake.parse(
            event, sender, action=self.action, config=self.config, artifacts=artifacts
        )

    def run_id(self, sender: str, team: str, event_source: str, event_id: str) -> str:
        """The run of a request: ``keys.run_id`` under this deployment's key."""
        return keys.run_id(
            self.config.cache_secret,
            sender=sender,
            team=team,
            event_source=event_source,
            event_id=event_id,
            action=self.action,
        )

    def repeatable(self, event: CloudEvent, sender: str = keys.ANONYMOUS) -> RepeatableGet | None:
        """What answers a repeat of this event from the cache memory (``answer_repeat``): a
        get without ``((var))`` references (those are looked up on each request). None for
        anything else (a stop among them); ``InvalidRequest`` as ``handle`` would raise it."""
        if is_stop(event):
            return None
        request = self.parse(event, sender)
        key = cache_key(self.config, request)
        if key is None:
            return None
        if credentials.find_references(request.source, request.params, request.version):
            return None
        return RepeatableGet(
            event_source=request.event_source,
            subject=request.subject,
            type_name=request.type_name,
            image=request.resource_type.image,
            cache_key=key,
            sender=request.sender,
            team=request.build.team,
        )

    def answer_repeat(self, get: RepeatableGet, event_id: str) -> tuple[str, Outcome] | None:
        """A repeat of a ``repeatable`` get with this id, when the cache memory answers it
        without a look in the store: its run id and outcome, logged and counted as ``handle``
        would (its reply is ``reply_event``'s); None otherwise (``handle`` decides then)."""
        remembered = self.cache_memory.peek(get.cache_key)
        if remembered is None or not self.artifact_teams.recorded(get.cache_key, get.team):
            return None
        run = self.run_id(get.sender, get.team, get.event_source, event_id)
        log_request(self.action, event_id, get.event_source, run, get, short_way=True)
        self.answers.count("cache")
        return run, Outcome(action=self.action, data=remembered)

    def _serve(self, call: Call) -> Reply:
        if call.cache_key is not None:  # the artifact it produces or is answered with is its team's
            self.artifact_teams.record(call.cache_key, call.request.build.team)
        remembered = self.cache_memory.fresh(call.cache_key) if call.cache_key else None
        if remembered is not None:
            # Ahead of this run's stored result: a hit starts nothing, and its reply has the
            # id a stored success of this run would have (only "cached" may differ).
            return self._answered(
                call, Answer(Outcome(action=self.action, data=remembered), "cache")
            )
        if self._stopped(call):
            return Reply(status=200)
        fresh = None
        if call.plan is not None:
            request, fresh, age = checks.from_history(
                self.store, call.request, call.plan, time.time()
            )
            call = with_request(self.config, call, request)
            if age is not None:
                self.metrics.check_age.labels(type_label(request.type_name)).observe(age)
        if call.request.reply_async:
            return self._start(call, fresh)
        answer, joined = self.flights.run(call.flight, lambda: self._answer(call, fresh))
        while joined and not answer.outcome.succeeded:
            # Another request's failure (its message, its log tail) is not this request's
            # answer: run its own (a redelivery of this request finds its run's stored one).
            answer, joined = self.flights.run(call.flight, lambda: self._answer(call, fresh))
        if joined:
            # The run may have been another request's: record the answer under this request's
            # run id too, so its redelivery replays it instead of running again. Its versions
            # are announced by the request whose run found them, not again by each joiner.
            outcome = answer.outcome
            results.record_if_absent(self.store, call.run, outcome, request=call.request.digest)
            answer = Answer(outcome, "joined", announce=False)
        return self._answered(call, answer)

    def _stopped(self, call: Call) -> bool:
        """Whether its sender stopped the request (``stop``): then nothing runs and no reply
        goes, for this delivery and every later one."""
        if not tombstones.stopped(self.store, call.run):
            return False
        log.info(
            "request stopped before it ran: no run, no reply",
            extra=fields(
                action=self.action,
                id=call.request.event_id,
                source=call.request.event_source,
                run_id=call.run,
            ),
        )
        return True

    def _start(self, call: Call, fresh: Outcome | None) -> Reply:
        """Asynchronous completion: 202 once the task is started (idempotent per run id), or
        the answer at once when there is one (stored, cached, fresh, another run's check)."""
        stored = self.answers.without_run(call, fresh)
        if stored is not None:
            return self._answered(call, stored)
        work = task(self.config, call)
        if call.lease is not None:
            return self._start_once(call, call.lease, work)
        self._begin(work, call.request.type_name)
        return Reply(status=202)

    def _begin(self, work: Task, type_name: str | None) -> None:
        """Start an asynchronous run; it is reported (and no longer counted for its team)
        when the runtime sees it end."""
        self.team_runs.take(work.team, work.run_id)  # 429 before the task starts

        def ended(outcome: Outcome) -> None:
            self.team_runs.done(work.team, work.run_id)
            self.report.ended(work, began, outcome)

        began = self.report.began(work, type_name)
        try:
            self.runtime.start(work, ended=ended)
        except BaseException:
            self.team_runs.done(work.team, work.run_id)
            raise

    def _start_once(self, call: Call, lease: str, work: Task) -> Reply:
        """An asynchronous check shared across replicas through its resource's lease: start
        its task holding the lease (the task releases it), or wait for the run of the
        replica holding it and answer in the HTTP response. Not a 202: a waiter has no task
        of its own to post its reply later, and the replica that would post it may be
        scaled down before the holder's run ends."""
        # Nobody renews a task's lease: it lasts the task's whole budget, and a waiter may
        # wait that long for the holder's task.
        ttl = async_lease_seconds(work.timeout_seconds, self.config.task_margin_seconds)
        outcome, _ = shared_check.start_or_wait(
            self.store,
            lease,
            run=call.run,
            ttl=ttl,
            timeout=ttl,
            start=lambda held: self._begin(replace(work, lease=held), call.request.type_name),
        )
        if outcome is None:
            return Reply(status=202)
        return self._answered(call, self.answers.joined(call))

    def _answer(self, call: Call, fresh: Outcome | None) -> Answer:
        """Inside the flight, so a redelivery arriving as a run ends sees its result."""
        stored = self.answers.without_run(call, fresh)
        if stored is not None:
            return stored
        work = task(self.config, call)
        if call.lease is None:
            return Answer(self._run(work, call.request.type_name), "run")
        return self._check_once(call, call.lease, work)

    def _check_once(self, call: Call, lease: str, work: Task) -> Answer:
        """A check shared across replicas through its resource's lease: run it, or wait for
        the run of the replica holding the lease and answer from it. A waiter's answer is
        stored under its own run id, so its redelivery replays it."""
        holding = False

        def run_holding() -> Outcome:
            nonlocal holding
            holding = True
            self.metrics.lease_waiters.dec()
            with self.metrics.leases_held.track_inprogress():
                return self._run(work, call.request.type_name)

        self.metrics.lease_waiters.inc()  # until it holds the lease, or the holder's run ends
        try:
            outcome, holder = shared_check.run_or_wait(
                self.store,
                lease,
                run=call.run,
                ttl=self.config.check_lease_seconds,
                timeout=work.timeout_seconds,
                work=run_holding,
            )
        finally:
            if not holding:
                self.metrics.lease_waiters.dec()
        if holder == call.run:  # our run, or our own earlier delivery's on another replica
            return Answer(outcome, "run")
        return self.answers.joined(call)

    def _run(self, work: Task, type_name: str | None) -> Outcome:
        with self.team_runs.held(work.team, work.run_id):  # 429 before the run starts
            began = self.report.began(work, type_name)
            outcome = self.runtime.run(work)
            self.report.ended(work, began, outcome)
            return outcome

    def _answered(self, call: Call, answer: Answer) -> Reply:
        """The reply to a call's answer, counted (``Answers.count``) here and only here."""
        self.answers.count(answer.how)
        return self._reply(call, answer.outcome, announce=answer.announce)

    def _reply(self, call: Call, outcome: Outcome, announce: bool = True) -> Reply:
        """The reply; ``announce``: post the check's discovered versions first (the request
        whose run added them to the history does; a joiner of its run does not)."""
        if announce:
            post_discoveries(self.config.sink, call, outcome)
        return Reply(status=200, event=reply_of(self.action, call, outcome))
