"""A namespace serves a team only by an administrator's word (functions/tekton/namespace_teams.py):
TEKTON_TEAMS, or the team label on the Namespace object; never by its name alone."""

from __future__ import annotations

import pytest

from functions.errors import ConfigError, Unavailable
from functions.setting_values import tekton_teams
from functions.settings import Settings
from functions.tekton.namespace_teams import REMEMBER_SECONDS, TEAM_LABEL, NamespaceTeams


class Namespaces:
    """Namespace labels as the API would answer them, counting the reads."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels = labels
        self.reads = 0

    def __call__(self, namespace: str) -> dict[str, str] | None:
        self.reads += 1
        return self.labels.get(namespace)


def test_a_namespace_named_like_a_team_is_no_team() -> None:
    teams = NamespaceTeams(None, Namespaces({"main": {}}))
    assert teams.team_of("main") is None
    assert "no valid resource-functions.dev/team label" in teams.refusal("main")


def test_the_team_label_names_the_team() -> None:
    teams = NamespaceTeams(None, Namespaces({"ci-web": {TEAM_LABEL: "web"}}))
    assert teams.team_of("ci-web") == "web"
    assert teams.team_of("elsewhere") is None


@pytest.mark.parametrize("value", ["", "Web", "web team", "-web", "x" * 64, "web/1"])
def test_a_label_that_is_not_a_team_name_serves_nothing(value: str) -> None:
    teams = NamespaceTeams(None, Namespaces({"ci": {TEAM_LABEL: value}}))
    assert teams.team_of("ci") is None


def test_tekton_teams_names_every_namespace_served_and_each_needs_its_label_too() -> None:
    """A namespace TEKTON_TEAMS maps but no administrator labelled would not be fenced (the
    tekton component's NetworkPolicy selects the label): it serves no team (issue 50)."""
    namespaces = Namespaces(
        {
            "ci": {TEAM_LABEL: "main"},
            "ci-web": {TEAM_LABEL: "web"},
            "unlabelled": {},
            "mislabelled": {TEAM_LABEL: "web"},
        }
    )
    teams = NamespaceTeams({"ci": "main", "unlabelled": "ops", "mislabelled": "ops"}, namespaces)
    found = {ns: teams.team_of(ns) for ns in ("ci", "ci-web", "unlabelled", "mislabelled")}
    assert found == {"ci": "main", "ci-web": None, "unlabelled": None, "mislabelled": None}
    assert "TEKTON_TEAMS does not name it" in teams.refusal("ci-web")
    said = teams.refusal("unlabelled")
    assert "no valid resource-functions.dev/team label" in said
    assert f"{TEAM_LABEL}=ops" in said


def test_a_label_is_read_once_while_remembered_and_a_removal_counts_after() -> None:
    now = [0.0]
    namespaces = Namespaces({"ci": {TEAM_LABEL: "main"}})
    teams = NamespaceTeams(None, namespaces, clock=lambda: now[0])
    assert [teams.team_of("ci") for _ in range(5)] == ["main"] * 5
    assert namespaces.reads == 1
    namespaces.labels["ci"] = {}
    now[0] = REMEMBER_SECONDS + 1
    assert teams.team_of("ci") is None and namespaces.reads == 2


def test_an_api_that_cannot_say_is_unavailable_not_no_team() -> None:
    def away(_namespace: str) -> dict[str, str] | None:
        raise Unavailable("Kubernetes API unreachable")

    with pytest.raises(Unavailable):
        NamespaceTeams(None, away).team_of("ci")


def test_tekton_teams_is_read_from_the_functions_settings() -> None:
    assert Settings.from_env({"TEKTON_TEAMS": '{"ci": "main"}'}).tekton_teams == {"ci": "main"}
    assert Settings.from_env({}).tekton_teams is None
    assert tekton_teams("  ") is None
    for bad in ("[1]", "{", '{"ci": 1}', '{"": "x"}'):
        with pytest.raises(ConfigError, match="TEKTON_TEAMS"):
            tekton_teams(bad)
