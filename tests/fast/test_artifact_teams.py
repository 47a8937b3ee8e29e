"""An artifact records the teams whose gets produced it or were answered with it (a small
record beside it in the store); a put whose input is an artifact of another team is refused
(403, naming the input) before anything starts: team B cannot stage team A's artifact into a
put that runs with B's credentials, nor learn its content. Through the HTTP layer and the
Service with the fake runtime and the file store."""

from __future__ import annotations

from typing import Any

from functions import keys
from storage import Store
from storage.artifacts import add_team, teams_of
from tests.support.http_helpers import IMAGE, FakeRuntime, cache_entry, event, make_client, post

SOURCE = {"uri": "x"}
CACHE_KEY = keys.cache_key(b"k" * 32, image=IMAGE, source=SOURCE, version={"ref": "v1"}, params={})


def get(team: str, event_id: str) -> Any:
    data = {"type": "mock", "source": SOURCE, "version": {"ref": "v1"}, "build": {"team": team}}
    return event("get", data, id=event_id)


def put(team: str, url: str, event_id: str = "p-1") -> Any:
    data = {"type": "mock", "source": SOURCE, "inputs": {"repo": url}, "build": {"team": team}}
    return event("put", data, id=event_id)


def test_a_put_of_another_teams_artifact_is_refused_before_it_runs(store: Store) -> None:
    url = store.url_for(cache_entry(store, CACHE_KEY))
    runtime = FakeRuntime(store)
    assert post(make_client(store, "get", runtime), get("team-a", "g-1")).status_code == 200
    puts = make_client(store, "put", runtime)

    refused = post(puts, put("team-b", url))
    allowed = post(puts, put("team-a", url, "p-2"))

    assert refused.status_code == 403
    error = refused.get_json()["error"]
    assert error["kind"] == "input_not_allowed"
    assert "'repo'" in error["message"] and "team-b" in error["message"]
    assert allowed.status_code == 200
    assert [task.action for task in runtime.ran] == ["put"]  # team A's alone


def test_a_team_answered_with_the_artifact_may_put_it(store: Store) -> None:
    url = store.url_for(cache_entry(store, CACHE_KEY))
    runtime = FakeRuntime(store)
    gets = make_client(store, "get", runtime)
    for n, team in enumerate(["team-a", "team-b", "team-b"]):  # B's repeat: the short way
        assert post(gets, get(team, f"g-{n}")).status_code == 200

    assert post(make_client(store, "put", runtime), put("team-b", url)).status_code == 200
    assert teams_of(store, f"artifacts/{CACHE_KEY}.tar.zst") == {"team-a", "team-b"}


def test_a_get_the_memory_answers_first_still_records_its_team(store: Store) -> None:
    url = store.url_for(cache_entry(store, CACHE_KEY))
    runtime = FakeRuntime(store)
    gets = make_client(store, "get", runtime)
    assert post(gets, get("team-a", "g-1")).status_code == 200
    assert post(gets, get("team-a", "g-2")).status_code == 200  # now remembered
    assert post(gets, get("team-c", "g-3")).status_code == 200  # a first sighting

    assert "team-c" in teams_of(store, f"artifacts/{CACHE_KEY}.tar.zst")
    assert post(make_client(store, "put", runtime), put("team-c", url)).status_code == 200


def test_an_artifact_no_get_recorded_is_refused(store: Store) -> None:
    key = "artifacts/uploaded.tar.zst"
    store_bytes(store, key)
    runtime = FakeRuntime(store)

    refused = post(make_client(store, "put", runtime), put("", store.url_for(key)))

    assert refused.status_code == 403 and not runtime.ran
    add_team(store, key, "")  # e.g. `run put --input DIR`, naming no team
    assert post(make_client(store, "put", runtime), put("", store.url_for(key))).status_code == 200


def store_bytes(store: Store, key: str) -> None:
    from functions.ledger import results

    results.write_once(store, key, b"bytes")
