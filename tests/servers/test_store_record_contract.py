"""The record (compare-and-swap) part of the store contract, on every backend (file, s3 on
versitygw, gcs on fake-gcs-server): create-only, replace-if-unchanged, and no lost update
under real concurrency, from threads and from processes."""

from __future__ import annotations

import io
import json
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from storage import ObjectExists, Store, StoreOptions, open_store
from storage.base import MAX_RECORD_BYTES, Record
from storage.compare_and_swap import update_record
from storage.store_errors import PreconditionFailed, StorageError
from tests.support.record_workers import add_to_counter


def test_a_missing_record_reads_as_none(store: Store) -> None:
    assert store.read_record("history/none.json") is None


def test_create_then_read_returns_the_bytes_and_the_token_written(store: Store) -> None:
    token = store.write_record("history/r.json", b'{"n": 1}', None)

    record = store.read_record("history/r.json")

    assert record is not None
    assert (record.data, record.token) == (b'{"n": 1}', token)


def test_create_is_refused_when_the_record_exists(store: Store) -> None:
    store.write_record("r", b"first", None)

    with pytest.raises(PreconditionFailed, match="r"):
        store.write_record("r", b"second", None)

    assert store.read_record("r").data == b"first"  # type: ignore[union-attr]


def test_replace_with_the_token_read_succeeds_and_gives_a_new_token(store: Store) -> None:
    first = store.write_record("r", b"one", None)

    second = store.write_record("r", b"two", first)

    assert store.read_record("r") == Record(b"two", second)
    assert second != first


def test_only_the_first_of_two_writers_from_one_read_succeeds(store: Store) -> None:
    store.write_record("r", b"base", None)
    read = store.read_record("r")
    assert read is not None

    store.write_record("r", b"winner", read.token)
    with pytest.raises(PreconditionFailed):
        store.write_record("r", b"loser", read.token)

    assert store.read_record("r").data == b"winner"  # type: ignore[union-attr]


def test_replace_of_a_deleted_record_is_refused(store: Store) -> None:
    token = store.write_record("r", b"one", None)
    store.delete("r")

    with pytest.raises(PreconditionFailed):
        store.write_record("r", b"two", token)

    assert store.read_record("r") is None


def test_a_token_of_other_bytes_is_refused(store: Store) -> None:
    store.write_record("a", b"one", None)
    other = store.write_record("b", b"two", None)

    with pytest.raises(PreconditionFailed):
        store.write_record("a", b"three", other)


def test_records_and_write_once_objects_share_the_key_space(store: Store) -> None:
    store.put("object", io.BytesIO(b"immutable"))
    store.write_record("record", b"x", None)

    with pytest.raises(PreconditionFailed):
        store.write_record("object", b"y", None)
    with pytest.raises(ObjectExists):
        store.put("record", io.BytesIO(b"y"))

    assert list(store.list()) == ["object", "record"]  # no lock or temp files listed


def test_oversized_records_are_refused(store: Store) -> None:
    with pytest.raises(StorageError, match="larger than"):
        store.write_record("big", b"x" * (MAX_RECORD_BYTES + 1), None)

    assert store.read_record("big") is None


def test_writers_that_read_the_same_state_have_exactly_one_winner_each_round(
    store_url: str,
) -> None:
    """Every round, all threads read, wait for each other, then write: exactly one write per
    round may stick, and the record ends holding one entry per round."""
    store = open_store(store_url, StoreOptions())
    store.write_record("race", b"[]", None)
    threads, rounds = 4, 5
    barrier = threading.Barrier(threads)

    def contend(name: int) -> list[bool]:
        wins = []
        for _ in range(rounds):
            read = store.read_record("race")
            assert read is not None
            barrier.wait(30)  # everybody holds the same token now
            data = json.dumps([*json.loads(read.data), name]).encode()
            try:
                store.write_record("race", data, read.token)
                wins.append(True)
            except PreconditionFailed:
                wins.append(False)
            barrier.wait(30)  # the round is over before anybody reads again
        return wins

    with ThreadPoolExecutor(threads) as pool:
        outcomes = list(pool.map(contend, range(threads)))

    assert [sum(round_) for round_ in zip(*outcomes, strict=True)] == [1] * rounds
    assert len(json.loads(store.read_record("race").data)) == rounds  # type: ignore[union-attr]


def test_concurrent_read_modify_writes_from_threads_lose_no_update(store_url: str) -> None:
    threads, times = 6, 8

    with ThreadPoolExecutor(threads) as pool:
        done = list(
            pool.map(lambda n: add_to_counter(store_url, "count", f"t{n}", times), range(threads))
        )

    items = json.loads(open_store(store_url).read_record("count").data)  # type: ignore[union-attr]
    assert done == [times] * threads
    assert sorted(items) == sorted(f"t{n}" for n in range(threads) for _ in range(times))


def test_concurrent_read_modify_writes_from_processes_lose_no_update(store_url: str) -> None:
    processes, times = 3, 8
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as a replica is

    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [
            pool.submit(add_to_counter, store_url, "count", f"p{n}", times)
            for n in range(processes)
        ]
        done = [future.result(timeout=300) for future in futures]

    items = json.loads(open_store(store_url).read_record("count").data)  # type: ignore[union-attr]
    assert done == [times] * processes
    assert sorted(items) == sorted(f"p{n}" for n in range(processes) for _ in range(times))


def test_update_record_leaves_the_record_alone_when_the_change_says_so(store: Store) -> None:
    token = store.write_record("r", b"same", None)

    result = update_record(store, "r", lambda current: (None, current))

    assert result == b"same"
    assert store.read_record("r").token == token  # type: ignore[union-attr]
