"""A full task namespace (its ResourceQuota) and the warm pods: Kubernetes' 403 "exceeded
quota" is told apart from a missing right, a warm pod that finds no room evicts the least
recently used idle warm pod of any team and tries again, and with none idle the check runs in
a Job (``NotWarm``); the shipped caps leave the quota room for the Jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from functions.errors import QuotaExceeded, Unavailable
from functions.kube.api import translate
from functions.runtimes.warm import pods as warm_pods
from functions.runtimes.warm.pods import WarmPods
from functions.runtimes.warm.pool import QUOTA, NotWarm, Slot, WarmPool
from functions.settings import Settings, WarmLimits

KNATIVE = Path(__file__).resolve().parents[2] / "knative"
FULL = (
    'pods "rf-warm-1" is forbidden: exceeded quota: task-pods, requested: pods=1, '
    "used: pods=40, limited: pods=40"
)


def api_error(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="Forbidden")
    err.body = json.dumps({"kind": "Status", "code": status, "message": message})
    return err


def test_a_full_quota_is_quota_exceeded_not_a_missing_right() -> None:
    full = translate(api_error(403, FULL), "create", "pods", "tasks")
    assert isinstance(full, QuotaExceeded)
    assert "ResourceQuota of namespace 'tasks' has no room" in str(full)
    assert "rbac" not in str(full).lower()
    forbidden = translate(
        api_error(403, "pods is forbidden: User cannot create"), "create", "pods", "t"
    )
    assert type(forbidden) is Unavailable and "knative/rbac.yaml" in str(forbidden)


def test_the_least_recently_used_idle_one_goes_whatever_its_team() -> None:
    removed: list[str] = []
    pool = WarmPool(WarmLimits(), removed.append)
    held: dict[str, Slot] = {}
    for key, team in (("a", "red"), ("b", "blue"), ("c", "red")):
        held[key] = pool.take(key, team, "s")
        pool.admit(held[key], f"pod-{key}")
    pool.back(held["a"])
    pool.back(held["b"])
    again = pool.take("a", "red", "s")  # a used again: b is the least recently used
    assert again.warm is held["a"].warm
    pool.back(again)
    assert pool.evict_idle(QUOTA) and removed == ["pod-b"]
    assert pool.evict_idle(QUOTA) and removed == ["pod-b", "pod-a"]
    assert not pool.evict_idle(QUOTA)  # c is busy
    assert pool.counts().evictions == {QUOTA: 2}


class FullApi:
    """Pods: refused as over quota ``full`` times, then created; deletes recorded."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.created: list[str] = []
        self.deleted: list[str] = []

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.full > 0:
            self.full -= 1
            raise QuotaExceeded(FULL)
        self.created.append(manifest["metadata"]["name"])
        return manifest

    def delete_pod(self, name: str, grace_seconds: int = 0) -> None:
        self.deleted.append(name)


def pods_with_one_idle(api: FullApi) -> WarmPods:
    pods = WarmPods(api, WarmLimits(), b"secret", owner="replica-1")  # type: ignore[arg-type]
    slot = pods.pool.take("other-teams", "blue", "s")
    pods.pool.admit(slot, "rf-warm-idle")
    pods.pool.back(slot)
    return pods


def test_a_warm_pod_over_quota_evicts_an_idle_one_and_is_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm_pods, "READY_POLL_SECONDS", 0.0)
    api = FullApi(full=2)
    pods = pods_with_one_idle(api)
    pods._create({"metadata": {"name": "rf-warm-new"}})
    assert api.deleted == ["rf-warm-idle"] and api.created == ["rf-warm-new"]


def test_with_nothing_idle_to_evict_the_check_runs_in_a_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm_pods, "READY_POLL_SECONDS", 0.0)
    api = FullApi(full=100)
    pods = WarmPods(api, WarmLimits(), b"secret", owner="replica-1")  # type: ignore[arg-type]
    with pytest.raises(NotWarm, match="no room for a warm pod"):
        pods._create({"metadata": {"name": "rf-warm-new"}})
    still_full = FullApi(full=100)
    with pytest.raises(NotWarm):
        pods_with_one_idle(still_full)._create({"metadata": {"name": "rf-warm-new"}})
    assert still_full.deleted == ["rf-warm-idle"]  # one eviction per check, not a purge


def test_warm_pods_have_a_quota_of_their_own_and_never_take_the_jobs_room() -> None:
    """Issue 49: as shipped, 4 warm pods per team times 20 check replicas could take 80
    pods of a 40-pod quota shared with the Jobs. Now the warm pods' PriorityClass sets them
    apart: the Jobs' quota does not count them, theirs counts them alone, the class yields
    to Jobs under a node's pressure, the pods the shipped config makes (warm checks on)
    carry it, and the check Service's replicas at their max-scale, each at its cap, fit
    the warm quota."""
    config = yaml.safe_load((KNATIVE / "config.yaml").read_text())["data"]
    docs = [d for d in yaml.safe_load_all((KNATIVE / "task-limits.yaml").read_text()) if d]
    quotas = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ResourceQuota"}
    (priority,) = [d for d in docs if d["kind"] == "PriorityClass"]
    limits = Settings.from_env({**config, "CACHE_SECRET": "x" * 32}).warm
    assert limits.enabled and limits.priority_class == priority["metadata"]["name"]
    services = yaml.safe_load_all((KNATIVE / "services.yaml").read_text())
    (check,) = [d for d in services if d and d["metadata"]["name"] == "check"]
    annotations = check["spec"]["template"]["metadata"]["annotations"]
    replicas = int(annotations["autoscaling.knative.dev/max-scale"])
    assert replicas * limits.per_replica <= int(quotas["warm-check-pods"]["hard"]["pods"])
    assert priority["value"] < 0 and priority["preemptionPolicy"] == "Never"
    assert not priority["globalDefault"]
    scope = {"scopeName": "PriorityClass", "values": [limits.priority_class]}
    assert quotas["task-pods"]["scopeSelector"]["matchExpressions"] == [
        {**scope, "operator": "NotIn"}
    ]
    assert quotas["warm-check-pods"]["scopeSelector"]["matchExpressions"] == [
        {**scope, "operator": "In"}
    ]
    assert int(quotas["warm-check-pods"]["hard"]["pods"]) >= 2 * limits.per_replica
    assert limits.per_team <= limits.per_replica
