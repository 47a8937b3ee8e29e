"""What a run leaves besides its result: its entry in the run index, its metrics, its
``run finished`` log line and (with tracing on) its spans. The service reports each run it
starts, synchronous or asynchronous, here; and each request's own line (``log_request``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from functions.ledger import run_index
from functions.logs import fields
from functions.metrics import Metrics
from functions.model import Action, Outcome, RepeatableGet, Request, Task
from functions.phases import seconds_by_phase
from functions.tracing import RunTracer
from storage import Store

log = logging.getLogger("functions")


@dataclass(frozen=True)
class Began:
    monotonic: float
    epoch_ns: int


class RunReport:
    def __init__(
        self, action: Action, store: Store, metrics: Metrics, tracer: RunTracer | None
    ) -> None:
        self.action = action
        self.store = store
        self.metrics = metrics
        self.tracer = tracer

    def began(self, task: Task, type_name: str | None) -> Began:
        """A run starts: its index entry (written once per run id)."""
        began = Began(time.monotonic(), time.time_ns())
        run_index.record_start(
            self.store,
            run=task.run_id,
            action=task.action,
            type_name=type_name,
            image=task.resource_type.image,
            started=began.epoch_ns / 1e9,
        )
        return began

    def ended(self, task: Task, began: Began, outcome: Outcome) -> None:
        """A run ended with ``outcome``: its metrics, log line and spans."""
        seconds = time.monotonic() - began.monotonic
        kind = "succeeded" if outcome.failure is None else outcome.failure.kind
        self.metrics.runs.labels(self.action, kind).inc()
        self.metrics.duration.labels(self.action).observe(seconds)
        artifact = (outcome.data or {}).get("artifact")
        if artifact:
            self.metrics.bytes.labels(self.action).inc(artifact["size"])
        phases = seconds_by_phase(outcome.phases)
        for phase, spent in phases.items():
            self.metrics.phase_duration.labels(self.action, phase).observe(spent)
        log.info(
            "run finished",
            extra=fields(
                action=self.action,
                run_id=task.run_id,
                outcome=kind,
                seconds=seconds,
                phases=phases,
            ),
        )
        if self.tracer is not None:
            self._export(task, outcome, kind, began.epoch_ns)

    def _export(self, task: Task, outcome: Outcome, kind: str, started_ns: int) -> None:
        """The run as a span (a child of the request's), a child span per phase."""
        try:
            assert self.tracer is not None
            self.tracer.export_run(
                name=f"{self.action} run",
                outcome=outcome,
                start_ns=started_ns,
                end_ns=time.time_ns(),
                trace=task.trace,
                attributes={
                    "resource_functions.action": self.action,
                    "resource_functions.run_id": task.run_id,
                    "resource_functions.outcome": kind,
                    "resource_functions.image": task.resource_type.image,
                },
            )
        except Exception:  # tracing must never fail a request
            log.exception("cannot export the run's spans", extra=fields(run_id=task.run_id))


def log_request(
    action: Action,
    event_id: str,
    event_source: str,
    run: str,
    what: Request | RepeatableGet,
    short_way: bool = False,
) -> None:
    """The request's line; ``short_way`` marks a repeat answered before the full way."""
    image = what.image if isinstance(what, RepeatableGet) else what.resource_type.image
    values: dict[str, object] = {
        "action": action,
        "id": event_id,
        "source": event_source,
        "run_id": run,
        "type": what.type_name,
        "image": image,
    }
    if short_way:
        values["short_way"] = True
    log.info("request", extra=fields(**values))
