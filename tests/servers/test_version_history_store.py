"""The version history in the store, on every backend (file, s3 on versitygw, gcs on
fake-gcs-server): checks of one resource from several threads at once lose no version."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from functions.ledger import history
from functions.model import HistoryPlan
from storage import Store

PLAN = HistoryPlan(resource_key="r" * 64, limit=1000)


def test_a_check_records_its_versions_and_reports_the_new_ones(store: Store) -> None:
    assert history.record_check(store, PLAN, [{"ref": "1"}, {"ref": "2"}], now=100.0) == [
        {"ref": "1"},
        {"ref": "2"},
    ]
    assert history.record_check(store, PLAN, [{"ref": "2"}, {"ref": "3"}], now=200.0) == [
        {"ref": "3"}
    ]

    known = history.read(store, PLAN.resource_key)
    assert known.versions == ({"ref": "1"}, {"ref": "2"}, {"ref": "3"})
    assert known.checked_at == 200.0
    assert list(store.list()) == [f"history/{PLAN.resource_key}.json"]


def test_concurrent_checks_of_one_resource_lose_no_version(store: Store) -> None:
    replicas, checks = 4, 5

    def replica(n: int) -> list[dict[str, str]]:
        found = []
        for i in range(checks):
            found += history.record_check(store, PLAN, [{"ref": f"{n}-{i}"}], now=float(i))
        return found

    with ThreadPoolExecutor(replicas) as pool:
        reported = [v for found in pool.map(replica, range(replicas)) for v in found]

    expected = sorted(f"{n}-{i}" for n in range(replicas) for i in range(checks))
    known = history.read(store, PLAN.resource_key)
    assert sorted(v["ref"] for v in known.versions) == expected
    assert sorted(v["ref"] for v in reported) == expected  # each one reported new exactly once
