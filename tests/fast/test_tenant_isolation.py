"""A team and a sender reach only what is theirs, through the HTTP layer and the Service with
the fake runtime and the file store.

- A run belongs to its request: the run id is keyed on the sender, the team, the event's
  ``(source, id)`` and the action; a later request that reuses the pair for other data is a
  400 ("event id reused") and never gets the first reply, even when its own ``((var))``
  cannot be resolved; a true redelivery replays.
- Teams are bound to senders: with sender authentication, ``SENDER_TEAMS`` says which teams a
  sender may name (403 otherwise, before any lookup or run), and the team travels as the
  event's ``team`` attribute, which must equal ``build.team`` (400).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from functions.credentials import Reference
from functions.http.senders import SenderCheck
from functions.model import Build
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post, reply_of

ENGINE = "system:serviceaccount:ci:engine"
TRIGGER = "system:serviceaccount:resource-functions:get-oidc-eventing.knative.dev-trigger"
INTRUDER = "system:serviceaccount:ci:task-pod"
TOKENS = {"engine": ENGINE, "trigger": TRIGGER, "intruder": INTRUDER}
RULES = '{"' + ENGINE + '": ["main", "ci-*"], "' + TRIGGER + '": ["*"], "' + INTRUDER + '": []}'


class CountingProvider:
    """A credential provider that says when it was asked: nothing may be looked up for a
    request that is refused."""

    def __init__(self) -> None:
        self.asked: list[tuple[Reference, Build]] = []

    def lookup(self, ref: Reference, build: Build) -> str | None:
        self.asked.append((ref, build))
        return {"main": "main-token", "blue": "blue-token", "ci-web": "web", "": "shared"}.get(
            build.team
        )


def get(
    team: str = "", version: str = "v1", attribute: str | None = None, token: str = "((token))"
) -> Any:
    """A get naming ``team`` in ``build.team``; ``attribute``: its event's ``team``."""
    data: dict[str, Any] = {"type": "mock", "source": {"token": token}}
    data["version"] = {"ref": version}
    if team:
        data["build"] = {"team": team}
    return event("get", data, **({} if attribute is None else {"team": attribute}))


def authenticated(store: Store, runtime: FakeRuntime, provider: CountingProvider) -> Any:
    senders = SenderCheck(lambda token, _: TOKENS.get(token), "rf", ("*",))
    app = make_client(
        store, "get", runtime, senders=senders, sender_audience="rf", sender_teams=parse(RULES)
    )
    app.application.extensions["service"].provider = provider
    return app


def parse(rules: str) -> Any:
    from functions.setting_values import sender_teams

    return sender_teams(rules, "rf")


def as_sender(token: str) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {token}"}}


# --- A run belongs to its request ---------------------------------------------------------


def test_a_pair_reused_for_another_request_is_400_and_never_gets_the_first_reply(
    store: Store,
) -> None:
    runtime = FakeRuntime(store)
    app = make_client(store, "get", runtime)
    first = post(app, get(version="v1", token="literal"))
    assert first.status_code == 200 and len(runtime.ran) == 1

    reused = post(app, get(version="v2", token="literal"))  # same (source, id), other data

    assert reused.status_code == 400
    assert "event id reused for another request" in reused.get_json()["error"]["message"]
    assert "v1" not in reused.get_data(as_text=True)
    assert len(runtime.ran) == 1
    again = post(app, get(version="v1", token="literal"))  # a true redelivery replays
    assert again.status_code == 200 and reply_of(again).get_data() == reply_of(first).get_data()
    assert len(runtime.ran) == 1


def test_a_reused_pair_whose_own_reference_cannot_resolve_is_refused_not_replayed(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "creds" / "teams" / "main").mkdir(parents=True)
    (tmp_path / "creds" / "teams" / "main" / "token").write_text("main-token")
    creds = {"credentials_provider": "dir", "credentials_dir": str(tmp_path / "creds")}
    runtime = FakeRuntime(store)
    app = make_client(store, "get", runtime, **creds)
    assert post(app, get(team="main")).status_code == 200

    poisoned = post(app, _unresolvable())

    assert poisoned.status_code == 400
    body = poisoned.get_data(as_text=True)
    assert "event id reused" in body and "artifact" not in body and "v1" not in body


def _unresolvable() -> Any:
    data = {"type": "mock", "source": {"token": "((missing))"}, "version": {"ref": "v1"}}
    return event("get", {**data, "build": {"team": "main"}})


def test_the_same_pair_from_another_team_is_another_run(store: Store, tmp_path: Path) -> None:
    for team in ("main", "blue"):
        (tmp_path / "creds" / "teams" / team).mkdir(parents=True)
        (tmp_path / "creds" / "teams" / team / "token").write_text(f"{team}-token")
    creds = {"credentials_provider": "dir", "credentials_dir": str(tmp_path / "creds")}
    runtime = FakeRuntime(store)
    app = make_client(store, "get", runtime, **creds)

    assert post(app, get(team="main")).status_code == 200
    assert post(app, get(team="blue")).status_code == 200

    assert len({task.run_id for task in runtime.ran}) == 2
    assert [b"main-token" in t.stdin for t in runtime.ran] == [True, False]


def test_the_same_pair_from_another_sender_is_another_run(store: Store) -> None:
    runtime, provider = FakeRuntime(store), CountingProvider()
    app = authenticated(store, runtime, provider)
    request = get(team="main", attribute="main")

    assert post(app, request, **as_sender("engine")).status_code == 200
    assert post(app, request, **as_sender("trigger")).status_code == 200

    assert len({task.run_id for task in runtime.ran}) == 2


# --- Teams are bound to senders -----------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "team", "status"),
    [
        ("engine", "main", 200),
        ("engine", "ci-web", 200),
        ("engine", "blue", 403),
        ("intruder", "main", 403),
        ("trigger", "blue", 200),  # a Trigger relays: the Broker's EventPolicy vetted the team
    ],
)
def test_a_sender_may_name_only_its_teams_and_a_refusal_looks_nothing_up(
    store: Store, sender: str, team: str, status: int
) -> None:
    runtime, provider = FakeRuntime(store), CountingProvider()
    app = authenticated(store, runtime, provider)

    response = post(app, get(team=team, attribute=team), **as_sender(sender))

    assert response.status_code == status, response.get_data(as_text=True)
    if status == 403:
        error = response.get_json()["error"]
        assert error["kind"] == "team_not_allowed" and team in error["message"]
        assert provider.asked == [] and runtime.ran == []
    else:
        assert len(provider.asked) == 1 and len(runtime.ran) == 1


def test_with_sender_authentication_the_team_travels_as_the_event_attribute(
    store: Store,
) -> None:
    runtime, provider = FakeRuntime(store), CountingProvider()
    app = authenticated(store, runtime, provider)

    missing = post(app, get(team="main"), **as_sender("engine"))

    assert missing.status_code == 400 and "ce-team" in missing.get_data(as_text=True)
    assert provider.asked == [] and runtime.ran == []


@pytest.mark.parametrize("sender_auth", [True, False], ids=["authenticated", "open"])
def test_a_team_attribute_other_than_build_team_is_400(store: Store, sender_auth: bool) -> None:
    runtime, provider = FakeRuntime(store), CountingProvider()
    app = (
        authenticated(store, runtime, provider)
        if sender_auth
        else make_client(store, "get", runtime)
    )

    response = post(app, get(team="blue", attribute="main"), **as_sender("engine"))

    assert response.status_code == 400
    assert "must equal build.team" in response.get_data(as_text=True)
    assert provider.asked == [] and runtime.ran == []


def test_a_request_naming_no_team_uses_shared_values_from_any_sender(store: Store) -> None:
    runtime, provider = FakeRuntime(store), CountingProvider()
    app = authenticated(store, runtime, provider)

    response = post(app, get(), **as_sender("intruder"))

    assert response.status_code == 200
    assert [build.team for _, build in provider.asked] == [""]


def test_sender_teams_without_sender_authentication_is_a_configuration_error() -> None:
    from functions.errors import ConfigError
    from functions.settings import Settings

    with pytest.raises(ConfigError, match="SENDER_AUDIENCE"):
        Settings.from_env({"SENDER_TEAMS": RULES})
    with pytest.raises(ConfigError, match="lists of team globs"):
        Settings.from_env({"SENDER_TEAMS": '{"a": "main"}', "SENDER_AUDIENCE": "rf"})
