"""The check lease (``functions.ledger.lease``) on every backend (file, s3 on versitygw, gcs on
fake-gcs-server): of replicas that find it free at once exactly one takes it, from threads
and from processes; an expired lease goes to exactly one of them; renewal and release by
the holder only."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from functions.ledger import lease
from storage import Store, StoreOptions, open_store
from tests.support.lease_workers import take_after
from tests.support.parallel import parallel

KEY = "leases/resource.json"


def take_together(store: Store, n: int) -> list[lease.Claim | None]:
    """``n`` threads read the lease, wait for each other, then try to take what they read."""
    barrier = threading.Barrier(n)

    def contend(i: int) -> lease.Claim | None:
        seen = lease.read(store, KEY)
        barrier.wait(60)
        if seen is not None and not seen.lease.free(time.time()):
            return None
        return lease.take(store, KEY, seen, run=f"run-{i}", ttl=60, now=time.time())

    return parallel(contend, n)


def holders(claims: list[lease.Claim | None]) -> list[str]:
    return [claim.lease.run for claim in claims if claim is not None]


def test_of_threads_that_find_no_lease_exactly_one_takes_it(store: Store) -> None:
    claims = take_together(store, 6)

    assert len(holders(claims)) == 1
    assert lease.read(store, KEY) == next(c for c in claims if c is not None)


def test_of_processes_that_find_no_lease_exactly_one_takes_it(store_url: str) -> None:
    processes = 3
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as a replica is
    with context.Manager() as manager, ProcessPoolExecutor(processes, mp_context=context) as pool:
        barrier = manager.Barrier(processes)
        futures = [
            pool.submit(take_after, store_url, KEY, f"p{n}", barrier) for n in range(processes)
        ]
        taken = [future.result(timeout=300) for future in futures]

    assert sorted(taken) == [False] * (processes - 1) + [True]
    held = lease.read(open_store(store_url, StoreOptions()), KEY)
    assert held is not None and held.lease.run == f"p{taken.index(True)}"


def test_an_expired_lease_is_taken_over_by_exactly_one_and_its_old_holder_loses_it(
    store: Store,
) -> None:
    dead = lease.take(store, KEY, None, run="dead", ttl=1, now=time.time() - 10)
    assert dead is not None and dead.lease.free(time.time())

    claims = take_together(store, 5)
    lease.release(store, KEY, dead)  # the old holder wakes up: its token is stale
    renewed = lease.renew(store, KEY, dead, ttl=60, now=time.time())

    assert len(holders(claims)) == 1 and renewed is None
    current = lease.read(store, KEY)
    assert current is not None and current.lease.run == holders(claims)[0]
    assert not current.lease.free(time.time())


def test_a_held_lease_is_not_taken_and_its_renewal_keeps_it(store: Store) -> None:
    held = lease.take(store, KEY, None, run="holder", ttl=60, now=time.time())
    assert held is not None

    renewed = lease.renew(store, KEY, held, ttl=120, now=time.time())

    assert renewed is not None and renewed.lease.expires > held.lease.expires
    assert holders(take_together(store, 4)) == []
    assert lease.renew(store, KEY, held, ttl=60, now=time.time()) is None  # stale token


def test_a_release_frees_the_lease_at_once_for_the_next_taker(store: Store) -> None:
    held = lease.take(store, KEY, None, run="first", ttl=3600, now=time.time())
    assert held is not None

    with lease.kept(store, KEY, held, ttl=3600):
        assert holders(take_together(store, 3)) == []
    claims = take_together(store, 3)

    assert len(holders(claims)) == 1 and holders(claims)[0] != "first"


def test_unreadable_lease_bytes_count_as_a_free_lease(store: Store) -> None:
    store.write_record(KEY, b"not json", None)

    assert len(holders(take_together(store, 3))) == 1


@pytest.mark.parametrize("ttl", [1.5], ids=["short-ttl"])
def test_a_long_check_keeps_its_lease_past_the_ttl(store: Store, ttl: float) -> None:
    """Renewal, not timing: the holder's block outlasts its TTL (it waits for four renewals,
    one every third of the TTL, to be written), and nobody finds the lease free meanwhile."""
    held = lease.take(store, KEY, None, run="long", ttl=ttl, now=time.time())
    assert held is not None
    seen_tokens = {held.token}

    with lease.kept(store, KEY, held, ttl=ttl):
        while len(seen_tokens) < 5:
            current = lease.read(store, KEY)
            assert current is not None and current.lease.run == "long"
            assert holders(take_together(store, 2)) == []
            seen_tokens.add(current.token)
            time.sleep(ttl / 6)

    released = lease.read(store, KEY)
    assert released is not None and released.lease.released


def test_a_task_releases_its_holding_by_nonce_and_never_a_later_holding(store: Store) -> None:
    """An asynchronous check's task knows its holding's nonce, not the lease's token."""
    held = lease.take(store, KEY, None, run="async", ttl=3600, now=time.time())
    assert held is not None

    assert lease.release_holding(store, KEY, held.lease.holder)
    assert not lease.release_holding(store, KEY, held.lease.holder)  # released already
    later = lease.take(store, KEY, lease.read(store, KEY), run="next", ttl=3600, now=time.time())
    assert later is not None and not lease.release_holding(store, KEY, held.lease.holder)

    current = lease.read(store, KEY)
    assert current is not None and current.lease == later.lease  # still held by "next"
