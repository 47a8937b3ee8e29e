"""((var)) references and the image allowlist through the HTTP layer and the Service, with the
fake runtime and the file store: what runs, what is refused (400/503) and the cache key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from functions.credentials import Reference
from functions.errors import Unavailable
from functions.model import Build
from storage import Store
from tests.support.http_helpers import FakeRuntime, event, make_client, post, reply_of

SECRET = "s3cr"  # short on purpose: resolved values are redacted whatever their length


@pytest.fixture
def creds(tmp_path: Path) -> Path:
    root = tmp_path / "creds"
    (root / "teams" / "main" / "git").mkdir(parents=True)
    (root / "teams" / "main" / "git" / "password").write_text(SECRET + "\n")
    (root / "shared").mkdir()
    (root / "shared" / "uri").write_text("https://git.example.com/r.git\n")
    return root


def client(store: Store, action: str, runtime: FakeRuntime, creds: Path, **kw: Any) -> Any:
    return make_client(
        store, action, runtime, credentials_provider="dir", credentials_dir=str(creds), **kw
    )


def get_event(source: dict[str, Any], team: str = "main", **attrs: Any) -> Any:
    return event(
        "get",
        {"type": "mock", "source": source, "version": {"ref": "v1"}, "build": {"team": team}},
        **attrs,
    )


def test_references_reach_the_run_resolved_and_nothing_else(store: Store, creds: Path) -> None:
    runtime = FakeRuntime(store)
    source = {"uri": "((uri))", "password": "x-((git.password))"}
    response = post(client(store, "get", runtime, creds), get_event(source))
    assert response.status_code == 200
    (task,) = runtime.ran
    assert json.loads(task.stdin)["source"] == {
        "uri": "https://git.example.com/r.git",
        "password": "x-" + SECRET,
    }
    assert SECRET in task.secrets and SECRET not in repr(task)
    assert SECRET not in response.get_data(as_text=True)
    assert SECRET.encode() not in b"".join(
        p.read_bytes() for p in Path(store.url[len("file://") :]).rglob("*") if p.is_file()
    )


def test_an_unresolvable_variable_is_400_naming_it_and_nothing_runs(
    store: Store, creds: Path
) -> None:
    runtime = FakeRuntime(store)
    response = post(
        client(store, "get", runtime, creds),
        get_event({"password": "((git.password))", "x": "((missing.field))"}, team="other"),
    )
    assert response.status_code == 400
    body = response.get_json()["error"]
    assert body["problems"] == [
        "((git.password)) cannot be resolved",
        "((missing.field)) cannot be resolved",
    ]
    assert not runtime.ran and not runtime.started


def test_no_provider_configured_is_400(store: Store) -> None:
    runtime = FakeRuntime(store)
    response = post(
        make_client(store, "check", runtime), event(data={"type": "mock", "source": {"p": "((p))"}})
    )
    assert response.status_code == 400 and "((p))" in response.get_json()["error"]["message"]
    assert not runtime.ran


def test_an_unreachable_provider_is_503(store: Store, creds: Path) -> None:
    class Down:
        def lookup(self, ref: Reference, build: Build) -> str | None:
            raise Unavailable("credentials: Kubernetes API unreachable")

    runtime = FakeRuntime(store)
    app_client = client(store, "get", runtime, creds)
    app_client.application.extensions["service"].provider = Down()
    response = post(app_client, get_event({"password": "((git.password))"}))
    assert response.status_code == 503 and not runtime.ran


def test_checks_may_carry_a_team_for_their_references(store: Store, creds: Path) -> None:
    runtime = FakeRuntime(store)
    data = {"type": "mock", "source": {"p": "((git.password))"}, "build": {"team": "main"}}
    response = post(client(store, "check", runtime, creds), event("check", data))
    assert response.status_code == 200
    assert json.loads(runtime.ran[0].stdin) == {"source": {"p": SECRET}, "version": None}


def test_cache_key_follows_the_resolved_source(store: Store, creds: Path) -> None:
    """Decision (README, Cache): the key is of the resolved values, not of the references.
    Same values by reference or literally: same key (a hit). A rotated credential, or the same
    reference meaning something else in another team: another key."""
    runtime = FakeRuntime(store)
    app = client(store, "get", runtime, creds)

    def key(source: dict[str, Any], ident: str, team: str = "main") -> str | None:
        post(app, get_event(source, team=team, id=ident))
        return runtime.ran[-1].cache_key

    by_reference = key({"password": "((git.password))"}, "a")
    assert key({"password": SECRET}, "b") == by_reference  # literal, same value
    (creds / "teams" / "main" / "git" / "password").write_text("rotated\n")
    assert key({"password": "((git.password))"}, "c") != by_reference
    (creds / "teams" / "main" / "git" / "password").write_text(SECRET)
    assert key({"password": "((git.password))"}, "d") == by_reference
    (creds / "teams" / "other" / "git").mkdir(parents=True)
    (creds / "teams" / "other" / "git" / "password").write_text("team-b")
    assert key({"password": "((git.password))"}, "e", team="other") != by_reference


@pytest.mark.parametrize(
    ("allowed", "image", "status"),
    [
        (("*",), "example.org/anything:1", 200),
        ((), "example.org/anything:1", 400),
        (("docker.io/concourse/*",), "docker.io/concourse/git-resource:1.17", 200),
        (("docker.io/concourse/*",), "docker.io/evil/git-resource:1", 400),
    ],
)
def test_explicit_images_must_match_allowed_images(
    store: Store, allowed: tuple[str, ...], image: str, status: int
) -> None:
    runtime = FakeRuntime(store)
    data = {"image": image, "source": {}}
    response = post(make_client(store, "check", runtime, allowed_images=allowed), event(data=data))
    assert response.status_code == status
    assert len(runtime.ran) == (status == 200)
    if status == 400:
        assert "ALLOWED_IMAGES" in response.get_json()["error"]["message"]


def test_catalogue_types_are_allowed_whatever_allowed_images_says(store: Store) -> None:
    runtime = FakeRuntime(store)
    response = post(make_client(store, "check", runtime, allowed_images=()), event())
    assert response.status_code == 200 and reply_of(response).get_data()["versions"]


def test_a_redelivery_replays_its_answer_after_its_credential_is_deleted(
    store: Store, creds: Path
) -> None:
    runtime = FakeRuntime(store)
    app = client(store, "get", runtime, creds)
    request = get_event({"password": "((git.password))"})
    first = post(app, request)
    assert first.status_code == 200
    (creds / "teams" / "main" / "git" / "password").unlink()
    again = post(app, request)
    assert again.status_code == 200 and len(runtime.ran) == 1
    assert reply_of(again).get_data() == reply_of(first).get_data()
    fresh = post(app, get_event({"password": "((git.password))"}, id="evt-2"))
    assert fresh.status_code == 400 and "((git.password))" in fresh.get_data(as_text=True)
