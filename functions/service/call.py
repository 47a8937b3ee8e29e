"""One request's call, made once per request: the request, its run id, its get's cache key,
its check's history plan and lease, the keys of its flight; and what derives from it alone
(its task)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from functions import keys, protocol
from functions.model import HistoryPlan, ReplyAddress, Request, Task
from functions.redaction import secret_values
from functions.service import checks
from functions.service.config import ServiceConfig


@dataclass(frozen=True)
class Call:
    request: Request
    run: str
    cache_key: str | None  # a get's cache entry
    plan: HistoryPlan | None  # a check's version history
    lease: str | None  # a check's lease record, when it is shared across replicas
    flight: tuple[str, ...]  # what identical requests in this process share (flight_keys)

    @property
    def reply_address(self) -> ReplyAddress:
        request = self.request
        return ReplyAddress(
            request.event_id, self.run, request.subject, request.build.team, request.trace
        )


def make_call(config: ServiceConfig, request: Request, run: str) -> Call:
    plan = checks.history_plan(
        request, cache_secret=config.cache_secret, limit=config.history_limit
    )
    key = cache_key(config, request)
    lease = None  # a get or put; or CHECK_LEASE_SECONDS=0, each replica checking alone
    if plan is not None and config.check_lease_seconds > 0:
        lease = keys.lease_record_key(plan.resource_key)
    return Call(
        request=request,
        run=run,
        cache_key=key,
        plan=plan,
        lease=lease,
        flight=flight_keys(config, request, run, key),
    )


def with_request(config: ServiceConfig, call: Call, request: Request) -> Call:
    """The same call for a request changed by the history (``latest-known`` resolved): the
    run, the cache key, the plan and the lease stay those of the request as sent; its
    flight is the resolved request's."""
    flight = flight_keys(config, request, call.run, call.cache_key)
    return replace(call, request=request, flight=flight)


def cache_key(config: ServiceConfig, request: Request) -> str | None:
    if request.action != "get":
        return None
    return keys.cache_key(
        config.cache_secret,
        image=request.resource_type.image,
        source=request.source,
        version=request.version,
        params=request.params,
    )


def flight_keys(
    config: ServiceConfig, request: Request, run: str, cache_key: str | None
) -> tuple[str, ...]:
    """Identical checks and gets arriving together share one run. A redelivery joins its
    run by run id and digest: another request reusing the run id never joins it (its
    runtime refuses it when it finds the run's container or Job)."""
    flight = [f"{run}:{request.digest}"]
    team = keys.canonical_json(request.build.team).decode()  # a team joins its own runs
    if cache_key:
        flight.append(f"get:{team}:{cache_key}")
    elif request.action == "check":
        flight.append(
            f"check:{team}:"
            + keys.cache_key(
                config.cache_secret,
                image=request.resource_type.image,
                source=request.source,
                version=request.version,
                params={},
                action="check",
            )
        )
    return tuple(flight)


def task(config: ServiceConfig, call: Call) -> Task:
    request = call.request
    # TASK_TIMEOUT_SECONDS is this service's ceiling (it must fit its request timeout);
    # a resource type may only lower it.
    timeout = min(request.resource_type.timeout_seconds or math.inf, config.task_timeout_seconds)
    return Task(
        run_id=call.run,
        action=request.action,
        resource_type=request.resource_type,
        stdin=protocol.stdin_payload(
            request.action, request.source, request.version, request.params
        ),
        env=protocol.build_env(request.action, request.build, request.trace),
        inputs=request.inputs,
        cache_key=call.cache_key,
        timeout_seconds=timeout,
        request_id=request.event_id,
        request_source=request.event_source,
        subject=request.subject,
        secrets=secret_values(
            source=request.source,
            params=request.params,
            resolved=request.secrets,
            keys=config.redact_keys,
        ),
        resolved=request.secrets,
        history=call.plan,
        trace=request.trace,
        request_digest=request.digest,
        team=request.build.team,
    )
