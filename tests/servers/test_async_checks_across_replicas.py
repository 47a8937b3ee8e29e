"""One check per resource across replicas with asynchronous replies (``REPLY_MODE=async``),
on every backend (file, s3 on versitygw, gcs on fake-gcs-server): the replica whose check
takes the resource's lease starts its task (202), which releases the lease once it has
recorded; identical checks on other replicas wait for that task and answer in their HTTP
response (200), recorded under their own run ids. The runtime stand-in starts each run id
once and records through the real ``steps`` code, release included."""

from __future__ import annotations

import time
from typing import Any

from functions.ledger import lease
from storage import Store, StoreOptions, open_store
from testbed.event_sink import EventSink
from testbed.repository_runtime import AsyncRepositoryRuntime
from tests.support.check_replicas import LEASE_KEY, check, replicas
from tests.support.parallel import parallel

SUCCEEDED = "dev.resourcefunctions.check.succeeded"


def async_replicas(store_url: str, runtime: AsyncRepositoryRuntime, n: int) -> list[Any]:
    return replicas(store_url, runtime, n, reply_mode="async", sink=runtime.sink)


def released_by(store: Store, run: str) -> bool:
    """Whether the lease was last held by ``run`` and is released now."""
    seen = lease.read(store, LEASE_KEY)
    return seen is not None and seen.lease.run == run and seen.lease.released


def test_identical_async_checks_on_several_replicas_start_one_task(
    store_url: str, sink: EventSink
) -> None:
    store = open_store(store_url, StoreOptions())
    runtime = AsyncRepositoryRuntime(store, sink.url, seconds=0.5)
    runtime.commits += ["2", "3"]
    services = async_replicas(store_url, runtime, 5)

    replies = parallel(lambda i: check(services[i], f"tick-{i}", version="latest-known"), 5)
    runtime.join()
    again = [check(services[(i + 1) % 5], f"tick-{i}", version="latest-known") for i in range(5)]

    assert len(runtime.starts) == 1 and len(runtime.stdins) == 1
    assert sorted(status for status, _ in replies) == [200] * 4 + [202]
    waiters = [data for status, data in replies if status == 200]
    assert waiters == [{"versions": [{"ref": "3"}], "new": []}] * 4
    posted = [event.get_data() for event in sink.drain() if event.get_type() == SUCCEEDED]
    assert posted == [{"versions": [{"ref": "3"}], "new": [{"ref": "3"}]}]  # the holder's
    assert released_by(store, runtime.starts[0].run_id)
    # Redelivered to other replicas: each replays its answer, the holder's its task's result.
    assert [data for _, data in again] == [
        posted[0] if status == 202 else data for status, data in replies
    ]
    assert len(runtime.starts) == 1


def test_a_redelivery_of_the_holders_event_attaches_to_its_task(
    store_url: str, sink: EventSink
) -> None:
    store = open_store(store_url, StoreOptions())
    runtime = AsyncRepositoryRuntime(store, sink.url, seconds=1.0)
    services = async_replicas(store_url, runtime, 2)

    first = check(services[0], "tick")
    again = check(services[1], "tick")  # to another replica, while the task runs
    runtime.join()

    assert first == again == (202, {})
    assert len(runtime.stdins) == 1  # one task: the runtime starts a run id once
    held = runtime.starts[0].lease
    assert held is not None and [task.lease for task in runtime.starts] == [held, held]
    assert released_by(store, runtime.starts[0].run_id)
    assert check(services[1], "tick") == (200, {"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})


def test_a_redelivery_of_a_warm_checks_event_waits_for_it_and_never_runs_it_again(
    store_url: str, sink: EventSink
) -> None:
    """A warm check runs in its delivery's request on one replica: the Broker's next
    delivery, on another replica, finds the lease its run holds and waits for that run's
    result (200), where a Job's would attach to the Job; the script runs once."""
    store = open_store(store_url, StoreOptions())
    runtime = AsyncRepositoryRuntime(store, sink.url, seconds=1.0)
    runtime.adopting = False
    services = async_replicas(store_url, runtime, 2)

    first = check(services[0], "tick")
    again = check(services[1], "tick")  # to another replica, while the first runs
    runtime.join()

    assert first == (202, {})
    assert again == (200, {"versions": [{"ref": "1"}], "new": [{"ref": "1"}]})
    assert len(runtime.starts) == 1 and len(runtime.stdins) == 1


def test_a_holder_whose_start_raised_releases_the_lease(store_url: str, sink: EventSink) -> None:
    store = open_store(store_url, StoreOptions())
    runtime = AsyncRepositoryRuntime(store, sink.url)
    runtime.refuse = 1  # the engine is unreachable at the first start
    services = async_replicas(store_url, runtime, 2)

    assert check(services[0], "tick-1") == (503, {})
    assert released_by(store, runtime.starts[0].run_id)
    assert check(services[1], "tick-2") == (202, {})  # no wait for the run that never started
    runtime.join()

    assert len(runtime.stdins) == 1
    assert released_by(store, runtime.starts[1].run_id)


def test_a_holder_whose_lease_expired_without_a_result_hands_the_check_to_one_waiter(
    store_url: str, sink: EventSink
) -> None:
    store = open_store(store_url, StoreOptions())
    # Its replica and its task died: no result, never released.
    assert lease.take(store, LEASE_KEY, None, run="dead", ttl=1, now=time.time()) is not None
    runtime = AsyncRepositoryRuntime(store, sink.url, seconds=0.5)
    services = async_replicas(store_url, runtime, 4)

    replies = parallel(lambda i: check(services[i], f"tick-{i}"), 4)
    runtime.join()

    assert len(runtime.starts) == 1 and len(runtime.stdins) == 1
    assert sorted(status for status, _ in replies) == [200] * 3 + [202]
    assert {str(data) for status, data in replies if status == 200} == {
        str({"versions": [{"ref": "1"}], "new": []})
    }
    assert released_by(store, runtime.starts[0].run_id)
