"""The warm check containers' bookkeeping (functions.runtimes.warm): keys, one check at a
time, expiry, the caps with the least recently used going first; removals recorded; image ids
remembered for a while (functions.runtimes.image_ids)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from functions.errors import ConfigError
from functions.model import ResourceType
from functions.runtimes.image_ids import LIMIT, ImageIds
from functions.runtimes.warm import Busy, WarmPool
from functions.runtimes.warm_check import warm_key
from functions.settings import WarmLimits, warm_limits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pool(**limits: object) -> tuple[WarmPool, list[str], Clock]:
    removed: list[str] = []
    clock = Clock()
    return WarmPool(WarmLimits(**limits), removed.append, clock), removed, clock  # type: ignore[arg-type]


def started(warm: WarmPool, key: str, team: str = "t") -> None:
    assert warm.take(key) is None
    kept = warm.admit(key, team, f"c-{key}")
    assert kept is not None
    warm.back(kept)


def test_the_key_separates_teams_images_sources_and_type_settings_and_hides_them():
    """Two types of one image whose settings differ (privileged, resources, placement, pull
    secrets) never share a warm container; the check's own budget does not split them."""
    plain = ResourceType(image="registry/r@sha256:1")
    base = {"team": "a", "image_digest": "sha256:1", "resource_key": "r1", "settings": plain}
    key = warm_key(**base)
    assert len(key) == 32 and all(c in "0123456789abcdef" for c in key)
    for change in (
        {"team": "b"},
        {"image_digest": "sha256:2"},
        {"resource_key": "r2"},
        {"settings": replace(plain, privileged=True)},
        {"settings": replace(plain, resources={"limits": {"memory": "1Gi"}})},
        {"settings": replace(plain, node_selector={"pool": "big"})},
        {"settings": replace(plain, tolerations=[{"key": "k", "operator": "Exists"}])},
        {"settings": replace(plain, image_pull_secrets=["pull"])},
    ):
        assert warm_key(**{**base, **change}) != key, change
    assert warm_key(**{**base, "settings": replace(plain, timeout_seconds=5)}) == key
    assert warm_key(**base) == key


def test_one_check_at_a_time_then_reused():
    warm, removed, _ = pool()
    assert warm.take("k") is None
    with pytest.raises(Busy):  # being started
        warm.take("k")
    first = warm.admit("k", "t", "c1")
    assert first is not None
    with pytest.raises(Busy):  # running its first check
        warm.take("k")
    warm.back(first)
    again = warm.take("k")
    assert again is first and again.reused
    assert warm.counts().reuses == 1 and warm.counts().starts == 1 and removed == []


def test_idle_and_age_expire():
    warm, removed, clock = pool(idle_seconds=10, max_age_seconds=100)
    started(warm, "idle")
    clock.now = 5
    started(warm, "busy")
    kept = warm.take("busy")
    clock.now = 12
    assert warm.expire() == 1 and removed == ["c-idle"]
    assert kept is not None
    warm.back(kept)
    clock.now = 106  # past its age (started at 5), and idle again
    assert warm.take("busy") is None and removed == ["c-idle", "c-busy"]
    assert warm.counts().evictions == {"idle": 1, "age": 1}


def test_caps_evict_the_least_recently_used_idle_one():
    warm, removed, clock = pool(per_team=2, per_replica=3)
    started(warm, "a1", "a")
    clock.now = 1
    started(warm, "a2", "a")
    clock.now = 2
    used = warm.take("a1")  # a1 is now the most recently used
    assert used is not None
    warm.back(used)
    started(warm, "a3", "a")  # the team's cap: a2 goes
    assert removed == ["c-a2"]
    started(warm, "b1", "b")
    started(warm, "b2", "b")  # the replica's cap: a1 goes (least recently used)
    assert removed == ["c-a2", "c-a1"]
    assert warm.counts().evictions == {"team_cap": 1, "replica_cap": 1}
    assert warm.counts().alive == 3


def test_no_room_when_all_are_busy_the_new_one_serves_one_check():
    warm, removed, _ = pool(per_replica=1)
    assert warm.take("a") is None
    busy = warm.admit("a", "t", "ca")
    assert warm.take("b") is None
    assert warm.admit("b", "t", "cb") is None  # a is busy: no room
    assert busy is not None and warm.counts().alive == 1 and removed == []


def test_evict_and_drain_remove():
    warm, removed, _ = pool()
    started(warm, "a")
    started(warm, "b")
    taken = warm.take("a")
    assert taken is not None
    warm.evict(taken, "budget")
    warm.drain()
    assert removed == ["c-a", "c-b"]
    assert warm.counts().evictions == {"budget": 1, "drain": 1} and warm.counts().alive == 0


def test_after_the_drain_nothing_is_kept():
    warm, removed, _ = pool()
    warm.drain()
    assert warm.take("late") is None
    late = warm.admit("late", "t", "c-late")
    assert late is None and warm.counts().alive == 0 and removed == []


def test_an_image_id_is_remembered_for_its_seconds_then_asked_again():
    clock = Clock()
    ids = ImageIds(60, clock)
    assert ids.get("r/app:1") is None
    ids.put("r/app:1", "sha256:a")
    clock.now = 59.9
    assert ids.get("r/app:1") == "sha256:a" and ids.get("r/other:1") is None
    clock.now = 60
    assert ids.get("r/app:1") is None  # a moved tag is seen within the time
    ids.put("r/app:1", "sha256:b")
    ids.forget("r/app:1")
    assert ids.get("r/app:1") is None


def test_zero_image_seconds_asks_the_engine_every_time_and_the_memory_is_bounded():
    never = ImageIds(0, Clock())
    never.put("r/app:1", "sha256:a")
    assert never.get("r/app:1") is None
    ids = ImageIds(60, Clock())
    for n in range(LIMIT + 1):
        ids.put(f"r/app:{n}", "sha256:a")
    assert ids.get("r/app:0") is None and ids.get(f"r/app:{LIMIT}") == "sha256:a"


def test_image_seconds_is_read_and_checked():
    assert warm_limits({}).image_seconds == 60
    assert warm_limits({"WARM_CHECK_IMAGE_SECONDS": "0"}).image_seconds == 0
    with pytest.raises(ConfigError, match="WARM_CHECK_IMAGE_SECONDS"):
        warm_limits({"WARM_CHECK_IMAGE_SECONDS": "-1"})
