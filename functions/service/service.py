"""One service = one action: validate a request, answer from stored results or the cache,
otherwise run the resource once (however often the request is delivered)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cloudevents.core.v1.event import CloudEvent

from functions import credentials, keys
from functions.errors import InvalidRequest
from functions.ledger import results, tombstones
from functions.logs import fields
from functions.metrics import Metrics, type_label
from functions.model import Action, Outcome, RepeatableGet, Request
from functions.runtimes import Runtime
from functions.service import checks, intake
from functions.service.answers import Answer, Answers, post_discoveries, reply_of
from functions.service.cache_memory import CacheMemory
from functions.service.call import Call, cache_key, make_call, with_request
from functions.service.config import ServiceConfig
from functions.service.paths import AsyncPath, Runs, SyncPath
from functions.service.run_report import RunReport, log_request
from functions.service.stop_requests import Stop, is_stop, parse_stop
from functions.service.teams import ArtifactTeams, TeamRuns, check_inputs
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
        tracer = RunTracer(f"resource-functions-{action}") if config.tracing else None
        self.answers = Answers(action, store, metrics, CacheMemory(config.cache_recheck_seconds))
        self.artifact_teams = ArtifactTeams(store)
        runs = Runs(
            runtime, RunReport(action, store, metrics, tracer), TeamRuns(config.max_runs_per_team)
        )
        self.sync_path = SyncPath(config, store, metrics, self.answers, runs)
        self.async_path = AsyncPath(config, store, self.answers, runs)

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
            answer = self.async_path.serve(call, fresh)
        else:
            answer = self.sync_path.serve(call, fresh)
        if answer is None:  # its task started: the task replies
            return Reply(status=202)
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
