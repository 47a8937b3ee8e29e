"""What an asynchronous check's lease is made of: a lifetime that outlasts its whole task
(nobody renews it while the task runs), and its identity, which travels in the task Job's
collect arguments to the step that releases it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from functions import cli
from functions.model import HistoryPlan, LeaseHold, ResourceType, Task
from functions.runtimes.kube.job_plan import KubernetesConfig, plan_for
from functions.runtimes.kube.podspec import job_manifest
from functions.steps.budget import async_lease_seconds
from functions.steps.pod_contract import CollectStep
from functions.task import in_pod

CONFIG = KubernetesConfig(namespace="tasks", service_account="task", task_image="rf:test")
HELD = LeaseHold(key="leases/" + "r" * 64 + ".json", holder="0123456789abcdef")


def check_task(timeout: float = 180, lease: LeaseHold | None = None) -> Task:
    return Task(
        run_id="a" * 32,
        action="check",
        resource_type=ResourceType(image="example.org/git@sha256:" + "b" * 64),
        stdin=b'{"source": {}}',
        env={},
        inputs={},
        cache_key=None,
        timeout_seconds=timeout,
        request_id="evt-1",
        history=HistoryPlan("r" * 64, limit=100),
        lease=lease,
    )


def collect_command(task: Task) -> list[str]:
    job = job_manifest(plan_for(task, CONFIG, "s3://bucket/ci", reply=True))
    command: list[str] = job["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


@pytest.mark.parametrize(
    ("timeout", "margin"), [(0.5, 0), (180, 60), (3000.2, 300)], ids=["tiny", "check", "long"]
)
def test_the_lease_outlasts_the_task_and_the_functions_wait_past_its_deadline(
    timeout: float, margin: float
) -> None:
    plan = plan_for(check_task(timeout), replace(CONFIG, margin_seconds=margin), "", reply=True)
    # The kubernetes runtime records a failure collect never saw (and releases) only after
    # the Job's deadline, its slack and its wait for a result; the container runtime's task
    # ends within the script's timeout plus the margin.
    follower_ends = (
        plan.active_deadline_seconds + CONFIG.deadline_slack_seconds + CONFIG.result_wait_seconds
    )

    assert async_lease_seconds(timeout, margin) > follower_ends > timeout + margin


def test_collect_is_told_the_lease_of_an_async_check_and_of_nothing_else() -> None:
    held = collect_command(check_task(lease=HELD))
    plain = collect_command(check_task())

    python_m_functions_collect = 4
    assert CollectStep.parse(held[python_m_functions_collect:]).lease == HELD
    assert CollectStep.parse(plain[python_m_functions_collect:]).lease is None


def test_the_collect_step_reads_its_lease_from_the_arguments_of_its_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[Any] = []
    monkeypatch.setattr(in_pod, "collect_main", lambda args, settings: given.append(args) or 0)
    monkeypatch.setenv("STORE_URL", "file:///nonexistent")
    python_m_functions = 3

    assert cli.main(collect_command(check_task(lease=HELD))[python_m_functions:]) == 0
    assert cli.main(collect_command(check_task())[python_m_functions:]) == 0
    assert [args.lease for args in given] == [HELD, None]
