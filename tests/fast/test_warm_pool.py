"""The warm check containers' bookkeeping (functions.runtimes.warm.pool): a container per
team, image and settings serving many sources, one check at a time per source, a second
container when one is full, waiting for one that starts, expiry, the caps with the least
recently used going first, a stop ending one check alone; image ids remembered for a while
(functions.runtimes.local.image_ids)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from functions.errors import ConfigError, RunStopped
from functions.model import ResourceType
from functions.runtimes.local.image_ids import LIMIT, ImageIds
from functions.runtimes.warm.check import pool_key, source_dir
from functions.runtimes.warm.pool import Busy, NoRoom, Slot, WarmPool
from functions.settings import WarmLimits, warm_limits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pool(**limits: object) -> tuple[WarmPool, list[str], Clock]:
    removed: list[str] = []
    clock = Clock()
    made = WarmPool(WarmLimits(**limits), removed.append, clock)  # type: ignore[arg-type]
    return made, removed, clock


def started(warm: WarmPool, key: str, source: str = "s", team: str = "t") -> Slot:
    """A new container for ``key`` (its first check, of ``source``, done)."""
    slot = warm.take(key, team, source)
    assert slot.warm is None
    warm.admit(slot, f"c-{key}-{warm.counts().starts}")
    warm.back(slot)
    return slot


def test_the_pool_key_separates_teams_images_and_type_settings_and_hides_them():
    """Sources of one team and one image share warm containers; two types of one image whose
    settings differ (privileged, resources, placement, pull secrets) never do; the check's own
    budget does not split them."""
    plain = ResourceType(image="registry/r@sha256:1")
    base = {"team": "a", "image_digest": "sha256:1", "settings": plain}
    key = pool_key(**base)
    assert len(key) == 32 and all(c in "0123456789abcdef" for c in key)
    for change in (
        {"team": "b"},
        {"image_digest": "sha256:2"},
        {"settings": replace(plain, privileged=True)},
        {"settings": replace(plain, resources={"limits": {"memory": "1Gi"}})},
        {"settings": replace(plain, node_selector={"pool": "big"})},
        {"settings": replace(plain, tolerations=[{"key": "k", "operator": "Exists"}])},
        {"settings": replace(plain, image_pull_secrets=["pull"])},
    ):
        assert pool_key(**{**base, **change}) != key, change
    assert pool_key(**{**base, "settings": replace(plain, timeout_seconds=5)}) == key
    names = {source_dir(f"resource-key-{n}") for n in range(100)}
    assert len(names) == 100 and all(len(n) == 32 for n in names)
    assert "resource-key-1" not in source_dir("resource-key-1")


def test_many_sources_share_one_container_each_one_check_at_a_time():
    warm, removed, _ = pool(checks_at_once=4)
    first = warm.take("k", "t", "s1")
    assert first.warm is None
    container = warm.admit(first, "c1")
    others = [warm.take("k", "t", f"s{n}") for n in (2, 3, 4)]
    assert all(o.warm is container and o.reused for o in others)
    with pytest.raises(Busy):  # s1's check still runs
        warm.take("k", "t", "s1")
    for slot in (first, *others):
        warm.back(slot)
    again = warm.take("k", "t", "s1")
    assert again.warm is container and again.reused
    warm.back(again)
    counts = warm.counts()
    assert (counts.alive, counts.starts, counts.reuses, counts.sources) == (1, 1, 4, 4)
    assert removed == []


def test_a_full_container_gets_a_second_and_a_source_goes_home_to_its_directory():
    warm, _, _ = pool(checks_at_once=2)
    a = warm.take("k", "t", "a")
    one = warm.admit(a, "c1")
    b = warm.take("k", "t", "b")
    assert b.warm is one
    c = warm.take("k", "t", "c")  # one is full: the caller starts a second
    assert c.warm is None
    two = warm.admit(c, "c2")
    for slot in (a, b, c):
        warm.back(slot)
    # each source goes back to the container that holds its directory
    assert [warm.take("k", "t", s).warm for s in ("c", "a", "b")] == [two, one, one]


def test_checks_that_find_a_container_starting_wait_for_it_not_for_a_job():
    warm, _, _ = pool(checks_at_once=8)
    starter = warm.take("k", "t", "s0")
    assert starter.warm is None
    got: list[Slot] = []
    waiters = [
        threading.Thread(target=lambda n=n: got.append(warm.take("k", "t", f"s{n}", wait=5)))
        for n in range(1, 6)
    ]
    for thread in waiters:
        thread.start()
    time.sleep(0.2)
    assert got == []  # they wait: one start at a time per key
    container = warm.admit(starter, "c1")
    for thread in waiters:
        thread.join(5)
    assert len(got) == 5 and all(s.warm is container for s in got)
    assert warm.counts().starts == 1


def test_with_no_room_within_its_wait_a_check_runs_without_reuse():
    warm, _, _ = pool(checks_at_once=1, per_replica=1)
    busy = warm.admit(warm.take("k", "t", "a"), "c1")
    with pytest.raises(NoRoom):
        warm.take("k", "t", "b", wait=0.1)
    assert busy.checks and warm.counts().alive == 1


def test_idle_and_age_expire_and_idle_sources_are_forgotten():
    warm, removed, clock = pool(idle_seconds=10, max_age_seconds=100)
    started(warm, "idle")
    clock.now = 5
    started(warm, "busy", "s1")
    kept = warm.take("busy", "t", "s2")
    clock.now = 16
    assert warm.expire() == 1 and removed == ["c-idle-0"]
    assert kept.warm is not None and set(kept.warm.sources) == {"s2"}  # s1 idle since 5
    warm.back(kept)
    clock.now = 106  # past its age (started at 5), and idle again
    assert warm.take("busy", "t", "s2").warm is None and removed == ["c-idle-0", "c-busy-1"]
    assert warm.counts().evictions == {"idle": 1, "age": 1}


def test_caps_evict_the_least_recently_used_idle_one():
    warm, removed, clock = pool(per_team=2, per_replica=3)
    started(warm, "a1", team="a")
    clock.now = 1
    started(warm, "a2", team="a")
    clock.now = 2
    warm.back(warm.take("a1", "a", "s"))  # a1 is now the most recently used
    started(warm, "a3", team="a")  # the team's cap: a2 goes
    assert removed == ["c-a2-1"]
    started(warm, "b1", team="b")
    started(warm, "b2", team="b")  # the replica's cap: a1 goes (least recently used)
    assert removed == ["c-a2-1", "c-a1-0"]
    assert warm.counts().evictions == {"team_cap": 1, "replica_cap": 1}
    assert warm.counts().alive == 3


def test_evict_and_drain_remove():
    warm, removed, _ = pool()
    started(warm, "a")
    started(warm, "b")
    taken = warm.take("a", "t", "s")
    assert taken.warm is not None
    warm.evict(taken.warm, "dead")
    warm.back(taken)
    warm.drain()
    assert removed == ["c-a-0", "c-b-1"]
    assert warm.counts().evictions == {"dead": 1, "drain": 1} and warm.counts().alive == 0


def test_after_the_drain_nothing_is_kept():
    warm, removed, _ = pool()
    warm.drain()
    late = warm.take("late", "t", "s")
    assert late.warm is None
    warm.admit(late, "c-late")
    assert warm.counts().alive == 0 and removed == []
    warm.back(late)
    assert removed == ["c-late"]


def test_a_stop_ends_that_check_alone():
    warm, removed, _ = pool()
    first = warm.take("k", "t", "a", run="run-a")
    container = warm.admit(first, "c1")
    other = warm.take("k", "t", "b", run="run-b")
    ended: list[str] = []
    first.cancel = lambda: ended.append("a")
    other.cancel = lambda: ended.append("b")
    assert warm.stop_run("run-a") and not warm.stop_run("run-z")
    assert ended == ["a"] and first.stopped and not other.stopped
    assert container.checks.keys() == {"a", "b"} and removed == []


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


def test_another_teams_start_counts_against_its_own_cap_only():
    warm, _, _ = pool(per_team=1, per_replica=8)
    starting_b = warm.take("kb", "b", "s")
    assert starting_b.warm is None  # team b starts a container
    starting_a = warm.take("ka", "a", "s")
    assert starting_a.warm is None  # team a's cap is its own


def test_a_stop_reaches_a_check_waiting_for_room_or_for_its_container():
    warm, _, _ = pool(checks_at_once=1, per_replica=1)
    starting = warm.take("k", "t", "a", run="run-a")
    assert starting.warm is None and warm.stop_run("run-a") and starting.stopped
    waiting: list[BaseException] = []

    def wait_for_room() -> None:
        try:
            warm.take("k", "t", "b", run="run-b", wait=10)
        except BaseException as err:  # noqa: BLE001 - what it ended with is the point
            waiting.append(err)

    thread = threading.Thread(target=wait_for_room)
    thread.start()
    time.sleep(0.2)
    assert warm.stop_run("run-b")
    thread.join(5)
    assert [type(e) for e in waiting] == [RunStopped]
