"""((var)) interpolation, the local directory provider and resolution errors (pure, no I/O but
a temporary directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.credentials import NoProvider, Reference, find_references, interpolate, resolve
from functions.credentials.directory import CredentialsDir
from functions.errors import InvalidRequest, Unavailable
from functions.model import Build
from functions.redaction import Redactor


def test_references_whole_and_part_of_strings_in_nested_values() -> None:
    value = {
        "uri": "https://((user)):((pw.token))@git/r",
        "list": ["((key))", 3, None],
        "((not-a-key))": "plain",
        "nested": {"x": "((user))"},
    }
    assert find_references(value) == [Reference("user"), Reference("pw", "token"), Reference("key")]
    resolved = {
        Reference("user"): "ci",
        Reference("pw", "token"): "t0k",
        Reference("key"): "-----BEGIN-----\nabc\n",
    }
    assert interpolate(value, resolved) == {
        "uri": "https://ci:t0k@git/r",
        "list": ["-----BEGIN-----\nabc\n", 3, None],
        "((not-a-key))": "plain",
        "nested": {"x": "ci"},
    }


def test_text_that_is_not_a_reference_is_left_alone() -> None:
    assert find_references({"a": "(( spaced ))", "b": "((", "c": "(x)"}) == []


@pytest.mark.parametrize(
    "text", ["((../etc/passwd))", "((a/b))", "((vault:x))", "((a.b.c))", "((.x))", '(("quoted"))']
)
def test_paths_var_sources_and_nested_fields_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        find_references({"x": text})


@pytest.fixture
def creds(tmp_path: Path) -> CredentialsDir:
    shared, main = tmp_path / "shared", tmp_path / "teams" / "main"
    (shared / "aws").mkdir(parents=True)
    (shared / "user").write_text("global-user\n")
    (shared / "pw").write_text("p")
    (shared / "aws" / "secret").write_text("aws-secret\n\n")
    main.mkdir(parents=True)
    (main / "user").write_text("main-user")
    (tmp_path / "teams" / "blue" / "token").mkdir(parents=True)
    (tmp_path / "teams" / "blue" / "token" / "value").write_text("blue-secret")
    (tmp_path / "teams" / "blue" / "plain").write_text("blue-plain")
    return CredentialsDir(tmp_path)


def test_dir_provider_files_fields_and_team_scope(creds: CredentialsDir) -> None:
    assert creds.lookup(Reference("user"), Build()) == "global-user"
    assert creds.lookup(Reference("user"), Build(team="main")) == "main-user"
    assert creds.lookup(Reference("user"), Build(team="other")) == "global-user"
    assert creds.lookup(Reference("aws", "secret"), Build(team="main")) == "aws-secret\n"
    assert creds.lookup(Reference("aws"), Build()) is None  # a directory is not a value
    assert creds.lookup(Reference("nope"), Build()) is None
    with pytest.raises(InvalidRequest):
        creds.lookup(Reference("user"), Build(team=".."))


@pytest.mark.parametrize("team", ["", "main", "other"], ids=["no-team", "team-main", "team-other"])
@pytest.mark.parametrize(
    "ref",
    [
        Reference("blue", "plain"),
        Reference("blue", "token"),
        Reference("teams", "blue"),
        Reference("token", "value"),
        Reference("plain"),
    ],
    ids=str,
)
def test_no_team_and_no_name_reaches_another_teams_values(
    creds: CredentialsDir, team: str, ref: Reference
) -> None:
    assert creds.lookup(ref, Build(team=team)) is None
    assert creds.lookup(Reference("plain"), Build(team="blue")) == "blue-plain"  # blue's own


def test_a_directory_in_the_old_layout_says_so_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "blue").mkdir()
    (tmp_path / "blue" / "token").write_text("blue-secret")  # team blue's, in the old layout
    (tmp_path / "user").write_text("old")
    provider = CredentialsDir(tmp_path)
    assert "shared/" in caplog.text and "teams/" in caplog.text
    assert provider.lookup(Reference("user"), Build(team="main")) is None
    for build in (Build(), Build(team="main")):  # the old fallback to the root read it
        assert provider.lookup(Reference("blue", "token"), build) is None


def test_a_missing_credentials_dir_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable):
        CredentialsDir(tmp_path / "absent").lookup(Reference("x"), Build())


def test_resolve_replaces_everywhere_and_lists_the_values(creds: CredentialsDir) -> None:
    resolved = resolve(
        creds,
        Build(team="main"),
        source={"u": "((user))", "p": "x((pw))y"},
        params={"k": "((aws.secret))"},
        version={"ref": "((pw))"},
    )
    assert resolved.source == {"u": "main-user", "p": "xpy"}
    assert resolved.params == {"k": "aws-secret\n"} and resolved.version == {"ref": "p"}
    assert resolved.values == ("aws-secret\n", "main-user", "p")
    assert "p" not in repr(resolved).replace("Resolved", "")


def test_unresolvable_variables_are_named_never_a_value(creds: CredentialsDir) -> None:
    with pytest.raises(InvalidRequest) as err:
        resolve(
            creds,
            Build(),
            source={"a": "((missing))", "b": "((pw))", "c": "((x.y))"},
            params={},
            version=None,
        )
    assert err.value.problems == ["((missing)) cannot be resolved", "((x.y)) cannot be resolved"]
    with pytest.raises(InvalidRequest, match="CREDENTIALS_PROVIDER"):
        resolve(NoProvider(), Build(), source={"a": "((a))"}, params={}, version=None)


def test_without_references_nothing_is_looked_up() -> None:
    class Exploding:
        def lookup(self, ref: Reference, build: Build) -> str | None:
            raise AssertionError("looked up")

    resolved = resolve(Exploding(), Build(), source={"a": "b"}, params={}, version=None)
    assert resolved.source == {"a": "b"} and resolved.values == ()


def test_a_resolved_value_too_short_to_redact_is_named_in_a_warning_never_shown(
    creds: CredentialsDir, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "shared" / "short").write_text("e\n")
    with caplog.at_level("WARNING", logger="functions.credentials"):
        resolved = resolve(
            creds, Build(), source={"a": "((short))", "b": "((user))"}, params={}, version=None
        )
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "((short))" in warnings[0].getMessage()
    assert warnings[0].fields == {"variable": "((short))"}  # type: ignore[attr-defined]
    assert " e " not in f" {warnings[0].getMessage()} "
    # "e" is never substituted: the log stays readable and does not point at the value
    redactor = Redactor(resolved.values)
    assert redactor.redact_text("Cloning repository") == "Cloning repository"
