"""A task's time budget (pure): the script's timeout, the margin for image pulls, stage and
collect, and the slack the function allows past a Job's deadline. Both runtimes, the Job spec
and the asynchronous check lease are sized from it.
"""

from __future__ import annotations

import math

# Past a task Job's deadline the function waits DEADLINE_SLACK_SECONDS before it judges the
# task timed out (a pod's end takes a moment to show), and up to RESULT_WAIT_SECONDS for the
# result of a completed Job. LEASE_SPARE_SECONDS: creating the Job, and replicas' clocks.
DEADLINE_SLACK_SECONDS = 30.0
RESULT_WAIT_SECONDS = 10.0
LEASE_SPARE_SECONDS = 30.0


def deadline_seconds(timeout: float, margin: float) -> int:
    """A task's whole budget (the Job's ``activeDeadlineSeconds``): the script's ``timeout``
    plus the ``margin`` for image pulls, stage and collect; whole seconds."""
    return max(1, math.ceil(timeout + margin))


def async_lease_seconds(timeout: float, margin: float) -> float:
    """How long an asynchronous check's lease lasts. Nobody renews it while the task runs
    (the service answered 202 and may be gone), so it outlasts the whole task: its deadline,
    the function's slack past it and its wait for the result (a failure collect never saw is
    recorded, and the lease released, only then), and a spare for starting it."""
    return (
        deadline_seconds(timeout, margin)
        + DEADLINE_SLACK_SECONDS
        + RESULT_WAIT_SECONDS
        + LEASE_SPARE_SECONDS
    )
