"""Distributed tracing: the request's W3C trace context (the CloudEvents ``traceparent`` and
``tracestate`` extension attributes) goes on to the reply event and into the task's env
(``TRACEPARENT``, ``TRACESTATE``: OpenTelemetry's env-var carriers); with
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) set, each run is exported as a span,
child of the request's, with a child span per phase. The OpenTelemetry SDK is imported only
then, and configures itself from its standard variables (``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*`` …); it exports OTLP over HTTP/protobuf.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from functions.model import Outcome, TraceContext

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,512}")  # printable ASCII; W3C's 512-char floor


def trace_context(traceparent: object, tracestate: object) -> TraceContext | None:
    """The trace context of a request, or None if it has none or an invalid ``traceparent``
    (W3C: then ``tracestate`` is ignored too). An invalid ``tracestate`` alone is dropped."""
    if not isinstance(traceparent, str):
        return None
    match = _TRACEPARENT.fullmatch(traceparent)
    if not match or match[1] == "ff" or set(match[2]) == {"0"} or set(match[3]) == {"0"}:
        return None
    state = tracestate if isinstance(tracestate, str) else ""
    return TraceContext(traceparent, state.strip() if _TRACESTATE.fullmatch(state) else "")


def trace_env(trace: TraceContext | None) -> dict[str, str]:
    """The env vars that hand the trace context to the resource script."""
    if trace is None:
        return {}
    env = {"TRACEPARENT": trace.traceparent}
    if trace.tracestate:
        env["TRACESTATE"] = trace.tracestate
    return env


def trace_attributes(trace: TraceContext | None) -> dict[str, str]:
    """The distributed-tracing extension attributes of a reply event."""
    return {key.lower(): value for key, value in trace_env(trace).items()}


def tracing_wanted(env: Mapping[str, str]) -> bool:
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    return bool(endpoint) and env.get("OTEL_SDK_DISABLED", "").lower() != "true"


class RunTracer:
    """Exports a span per run and per phase through the OpenTelemetry SDK (batched, in the
    background; flushed at exit). Its own provider: nothing global is set."""

    def __init__(self, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, where set, win over this default.
        resource = Resource.create({SERVICE_NAME: service_name})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("resource-functions")
        self._propagator = TraceContextTextMapPropagator()

    def export_run(
        self,
        *,
        name: str,
        outcome: Outcome,
        start_ns: int,
        end_ns: int,
        trace: TraceContext | None,
        attributes: Mapping[str, str],
    ) -> None:
        from opentelemetry import trace as otel
        from opentelemetry.trace import Status, StatusCode

        parent = self._propagator.extract(trace_attributes(trace)) if trace else None
        run = self._tracer.start_span(
            name, context=parent, start_time=start_ns, attributes=dict(attributes)
        )
        if outcome.failure is not None:
            run.set_attribute("resource_functions.failure", outcome.failure.kind)
            run.set_status(Status(StatusCode.ERROR, outcome.failure.kind))
        within = otel.set_span_in_context(run)
        for phase in outcome.phases:
            span = self._tracer.start_span(phase.name, context=within, start_time=phase.start_ns)
            span.end(end_time=phase.end_ns)
        run.end(end_time=end_ns)

    def close(self) -> None:
        self._provider.shutdown()
