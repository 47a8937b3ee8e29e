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
from functions.runtimes import warm_pods
from functions.runtimes.warm import QUOTA, NotWarm, WarmPool
from functions.runtimes.warm_pods import WarmPods
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
    held = {}
    for key, team in (("a", "red"), ("b", "blue"), ("c", "red")):
        assert pool.take(key) is None
        held[key] = pool.admit(key, team, f"pod-{key}")
    pool.back(held["a"])
    pool.back(held["b"])
    assert pool.take("a") is held["a"]  # a used again: b is the least recently used
    pool.back(held["a"])
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
    pods = WarmPods(api, WarmLimits(), owner="replica-1")  # type: ignore[arg-type]
    assert pods.pool.take("other-teams") is None
    warm = pods.pool.admit("other-teams", "blue", "rf-warm-idle")
    assert warm is not None
    pods.pool.back(warm)
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
    pods = WarmPods(api, WarmLimits(), owner="replica-1")  # type: ignore[arg-type]
    with pytest.raises(NotWarm, match="no room for a warm pod"):
        pods._create({"metadata": {"name": "rf-warm-new"}})
    still_full = FullApi(full=100)
    with pytest.raises(NotWarm):
        pods_with_one_idle(still_full)._create({"metadata": {"name": "rf-warm-new"}})
    assert still_full.deleted == ["rf-warm-idle"]  # one eviction per check, not a purge


def test_the_shipped_warm_caps_leave_the_task_quota_room_for_jobs() -> None:
    """Two check replicas keeping their whole cap of warm pods take at most half the shipped
    quota's pods; the rest is the Jobs'."""
    config = yaml.safe_load((KNATIVE / "config.yaml").read_text())["data"]
    quota = next(
        d
        for d in yaml.safe_load_all((KNATIVE / "task-limits.yaml").read_text())
        if d and d["kind"] == "ResourceQuota"
    )
    pods = int(quota["spec"]["hard"]["pods"])
    limits = Settings.from_env({**config, "CACHE_SECRET": "x" * 32}).warm
    assert 2 * limits.per_replica <= pods // 2
    assert limits.per_team <= limits.per_replica
