"""The version history as data: merging what a check found (Concourse's order), the bound,
reading a record back, and what a check answered from the history prints."""

from __future__ import annotations

import pytest

from functions.ledger.history import History, dump, merge, parse, since


def v(*refs: str) -> list[dict[str, str]]:
    return [{"ref": ref} for ref in refs]


@pytest.mark.parametrize(
    "known, found, merged, new",
    [
        pytest.param([], v("1", "2"), v("1", "2"), v("1", "2"), id="first-check"),
        pytest.param(v("1", "2"), v("2", "3"), v("1", "2", "3"), v("3"), id="from-the-latest"),
        pytest.param(v("1", "2"), v("2"), v("1", "2"), [], id="nothing-new"),
        pytest.param(v("1", "2", "3"), v("1"), v("1", "2", "3"), [], id="stale-check-keeps-order"),
        pytest.param(v("1", "2", "3"), v("1", "4"), v("2", "3", "1", "4"), v("4"), id="reordered"),
        pytest.param([], v("1", "2", "1"), v("2", "1"), v("2", "1"), id="repeat-counts-last"),
        pytest.param(v("1"), [], v("1"), [], id="empty-output"),
    ],
)
def test_merge_follows_concourse_check_order(known, found, merged, new) -> None:
    assert merge(known, found, limit=100) == (tuple(merged), new)


def test_merge_drops_the_oldest_versions_over_the_limit() -> None:
    assert merge(v("1", "2"), v("3", "4"), limit=3) == (tuple(v("2", "3", "4")), v("3", "4"))


def test_versions_are_compared_whole_not_by_key_order() -> None:
    known = [{"ref": "a", "time": "t"}]

    assert merge(known, [{"time": "t", "ref": "a"}], limit=10)[1] == []


def test_a_record_reads_back_as_written() -> None:
    history = History(versions=tuple(v("1", "2")), checked_at=1767225600.5)

    assert parse(dump(history)) == history
    assert history.latest == {"ref": "2"}


@pytest.mark.parametrize(
    "data", [None, b"", b"not json", b"[]", b'{"versions": [1, {"ref": 2}]}'], ids=str
)
def test_a_missing_or_unreadable_record_is_an_empty_history(data) -> None:
    assert parse(data) == History()


@pytest.mark.parametrize(
    "version, printed",
    [
        pytest.param({"ref": "2"}, v("2", "3"), id="known-version-and-newer"),
        pytest.param({"ref": "9"}, v("3"), id="unknown-version-the-latest"),
        pytest.param(None, v("3"), id="no-version-the-latest"),
    ],
)
def test_an_answer_from_history_prints_what_the_check_would(version, printed) -> None:
    assert since(History(tuple(v("1", "2", "3")), 1.0), version) == printed
    assert since(History(), version) == []
