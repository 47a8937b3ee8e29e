"""The two paths a call takes once nothing answered it ahead of them (the cache memory, a
stop, the history): ``SyncPath`` answers in the HTTP response, ``AsyncPath`` starts a task
that posts the reply to K_SINK. Each serves a call: the answer that makes a run needless,
else the call's own run, or (a check whose call has a lease) the run of the replica holding
its resource's lease. ``Runs`` is what both run through."""

from __future__ import annotations

from dataclasses import replace

from functions.ledger import results
from functions.metrics import Metrics
from functions.model import Outcome, Task
from functions.runtimes import Runtime
from functions.service import shared_check
from functions.service.answers import Answer, Answers
from functions.service.call import Call, task
from functions.service.config import ServiceConfig
from functions.service.flights import Flights
from functions.service.run_report import RunReport
from functions.service.teams import TeamRuns
from functions.steps.budget import async_lease_seconds
from storage import Store


class Runs:
    """A call's own run, counted for its team while it lasts (``TeamRuns``: 429 before it
    starts) and reported (``RunReport``): to its end (``run``) or started (``start``)."""

    def __init__(self, runtime: Runtime, report: RunReport, team_runs: TeamRuns) -> None:
        self.runtime = runtime
        self.report = report
        self.team_runs = team_runs

    def run(self, work: Task, type_name: str | None) -> Outcome:
        with self.team_runs.held(work.team, work.run_id):
            began = self.report.began(work, type_name)
            outcome = self.runtime.run(work)
            self.report.ended(work, began, outcome)
            return outcome

    def start(self, work: Task, type_name: str | None) -> None:
        """Start an asynchronous run; it is reported (and no longer counted for its team)
        when the runtime sees it end."""
        self.team_runs.take(work.team, work.run_id)

        def ended(outcome: Outcome) -> None:
            self.team_runs.done(work.team, work.run_id)
            self.report.ended(work, began, outcome)

        began = self.report.began(work, type_name)
        try:
            self.runtime.start(work, ended=ended)
        except BaseException:
            self.team_runs.done(work.team, work.run_id)
            raise


class SyncPath:
    """The answer in the HTTP response. Identical requests in this process share one run
    (``Call.flight``)."""

    def __init__(
        self, config: ServiceConfig, store: Store, metrics: Metrics, answers: Answers, runs: Runs
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.answers = answers
        self.runs = runs
        self.flights = Flights()

    def serve(self, call: Call, fresh: Outcome | None) -> Answer:
        answer, joined = self.flights.run(call.flight, lambda: self._answer(call, fresh))
        while joined and not answer.outcome.succeeded:
            # Another request's failure (its message, its log tail) is not this request's
            # answer: run its own (a redelivery of this request finds its run's stored one).
            answer, joined = self.flights.run(call.flight, lambda: self._answer(call, fresh))
        if not joined:
            return answer
        # The run may have been another request's: record the answer under this request's
        # run id too, so its redelivery replays it instead of running again. Its versions
        # are announced by the request whose run found them, not again by each joiner.
        outcome = answer.outcome
        results.record_if_absent(self.store, call.run, outcome, request=call.request.digest)
        return Answer(outcome, "joined", announce=False)

    def _answer(self, call: Call, fresh: Outcome | None) -> Answer:
        """Inside the flight, so a redelivery arriving as a run ends sees its result."""
        stored = self.answers.without_run(call, fresh)
        if stored is not None:
            return stored
        work = task(self.config, call)
        if call.lease is None:
            return Answer(self.runs.run(work, call.request.type_name), "run")
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
                return self.runs.run(work, call.request.type_name)

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


class AsyncPath:
    """202 once the call's task is started (idempotent per run id): the task posts the
    reply. The answer at once when there is one (stored, cached, fresh, another replica's
    check)."""

    def __init__(self, config: ServiceConfig, store: Store, answers: Answers, runs: Runs) -> None:
        self.config = config
        self.store = store
        self.answers = answers
        self.runs = runs

    def serve(self, call: Call, fresh: Outcome | None) -> Answer | None:
        """The answer, or None once the task is started."""
        stored = self.answers.without_run(call, fresh)
        if stored is not None:
            return stored
        work = task(self.config, call)
        if call.lease is None:
            self.runs.start(work, call.request.type_name)
            return None
        return self._start_once(call, call.lease, work)

    def _start_once(self, call: Call, lease: str, work: Task) -> Answer | None:
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
            start=lambda held: self.runs.start(replace(work, lease=held), call.request.type_name),
            # A lease this run holds already is an earlier delivery's: its task is found
            # again where the runtime adopts it (a Job), else waited for (a warm check, run
            # in that delivery's request on its replica, would run twice).
            rejoin=self.runs.runtime.adopts(work),
        )
        if outcome is None:
            return None
        return self.answers.joined(call)
