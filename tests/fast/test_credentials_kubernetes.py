"""The Kubernetes Secret credential provider against kmock's Kubernetes emulator, through the
official client (``functions.kube.api``): Concourse's lookup order and keys, one
``get`` per candidate and never a list, and API errors classified (403/unreachable = 503).
The same provider against a real API server: see tests/cluster (KubernetesSecrets)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes import client

from functions.credentials import Reference, resolve
from functions.credentials.namespace_secrets import KubernetesSecrets
from functions.errors import InvalidRequest, Unavailable
from functions.kube.api import KubeApi
from functions.model import Build
from tests.support.kube_emulator import Cluster, api, api_client_for, cluster

__all__ = ["api", "cluster"]
TEAM = Build(team="main", pipeline="deploy")


def put_secret(api_client: Any, namespace: str, name: str, **data: str) -> None:
    client.CoreV1Api(api_client).create_namespaced_secret(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )


@pytest.fixture
def secrets(api: Any) -> KubernetesSecrets:
    put_secret(api, "concourse-main", "git", value="team-password", user="ci")
    put_secret(api, "concourse-main", "deploy.git", value="pipeline-password")
    put_secret(api, "concourse-main", "token", value="t")
    put_secret(api, "concourse-other", "token", value="other-team")
    put_secret(api, "ci-main", "token", value="prefixed")
    return KubernetesSecrets(KubeApi(api, "tasks", (5.0, 10.0)))


def test_concourse_lookup_order_and_keys(secrets: KubernetesSecrets) -> None:
    assert secrets.lookup(Reference("git"), TEAM) == "pipeline-password"  # <pipeline>.<name>
    assert secrets.lookup(Reference("git"), Build(team="main")) == "team-password"
    assert secrets.lookup(Reference("git", "user"), TEAM) == "ci"  # falls back to <name>
    assert secrets.lookup(Reference("token"), Build(team="other")) == "other-team"
    assert secrets.lookup(Reference("git", "nokey"), TEAM) is None
    assert secrets.lookup(Reference("absent"), TEAM) is None
    assert secrets.lookup(Reference("token"), Build(team="nosuchteam")) is None
    assert secrets.lookup(Reference("token"), Build()) is None  # no team, no namespace


@pytest.mark.parametrize(
    "build",
    [Build(), Build(team="main"), Build(team="main", pipeline="other"), Build(pipeline="other")],
    ids=["no-team", "team-main", "team-main-pipeline", "pipeline-alone"],
)
@pytest.mark.parametrize(
    "ref",
    [Reference("token"), Reference("other", "token"), Reference("concourse-other", "token")],
    ids=str,
)
def test_no_team_and_no_name_reaches_another_teams_secrets(
    api: Any, secrets: KubernetesSecrets, build: Build, ref: Reference
) -> None:
    put_secret(api, "concourse-other", "other.token", value="other-team")
    put_secret(api, "concourse-other", "other", token="other-team")
    assert secrets.lookup(ref, build) != "other-team"


def test_the_namespace_prefix_is_configurable(api: Any, secrets: KubernetesSecrets) -> None:
    prefixed = KubernetesSecrets(secrets.api, prefix="ci-")
    assert prefixed.lookup(Reference("token"), Build(team="main")) == "prefixed"


def test_only_gets_never_lists(secrets: KubernetesSecrets, cluster: Cluster) -> None:
    before = len(cluster.requests("fetch", "secrets"))
    resolved = resolve(
        secrets, TEAM, source={"p": "((git))", "u": "((git.user))"}, params={}, version=None
    )
    assert resolved.source == {"p": "pipeline-password", "u": "ci"}
    assert set(resolved.values) == {"pipeline-password", "ci"}
    assert len(cluster.requests("fetch", "secrets")) - before == 3  # deploy.git, then git
    assert not cluster.requests("list", "secrets") and not cluster.requests("watch", "secrets")


def test_unresolvable_is_400_naming_the_variable(secrets: KubernetesSecrets) -> None:
    with pytest.raises(InvalidRequest) as err:
        resolve(
            secrets, TEAM, source={"a": "((absent.key))", "b": "((git))"}, params={}, version=None
        )
    assert err.value.problems == [
        (
            "((absent.key)) cannot be resolved (no Secret holds it in the team's credential "
            "namespace)"
        )
    ]


def test_forbidden_is_unavailable_naming_the_namespace(
    cluster: Cluster, secrets: KubernetesSecrets
) -> None:
    (
        cluster.emulator["get", "/api/v1/namespaces/concourse-main/secrets/git"]
        << 403
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "code": 403,
            "reason": "Forbidden",
            "message": 'secrets "git" is forbidden',
        }
    )
    with pytest.raises(Unavailable, match=r"'get secrets' in namespace 'concourse-main'"):
        secrets.lookup(Reference("git"), Build(team="main"))


def test_unreachable_api_is_unavailable(unused_port: int) -> None:
    api_client = api_client_for(f"http://127.0.0.1:{unused_port}")
    provider = KubernetesSecrets(KubeApi(api_client, "tasks", (2.0, 2.0)))
    with pytest.raises(Unavailable, match="unreachable"):
        provider.lookup(Reference("git"), TEAM)
    api_client.close()


def test_undecodable_values_are_refused_without_quoting_them(
    api: Any, secrets: KubernetesSecrets
) -> None:
    client.CoreV1Api(api).create_namespaced_secret(
        "concourse-main",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "binary"},
            "data": {"value": base64.b64encode(b"\xff\xfe").decode()},
        },
    )
    with pytest.raises(InvalidRequest, match=r"\(\(binary\)\).*not UTF-8"):
        secrets.lookup(Reference("binary"), Build(team="main"))


# --- a team prefix never reaches the platform's namespaces ----------------------------------


@pytest.mark.parametrize(
    ("prefix", "reached"),
    [
        ("resource-functions-", "resource-functions-tasks"),  # team "tasks"
        ("resource-", "resource-functions"),  # team "functions"
        ("", "resource-functions"),  # any namespace at all
    ],
    ids=["task-namespace", "functions-namespace", "empty-prefix"],
)
def test_a_prefix_that_reaches_a_platform_namespace_is_refused_at_start(
    prefix: str, reached: str
) -> None:
    from functions.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        KubernetesSecrets(
            None,  # type: ignore[arg-type]  # refused before any API use
            prefix,
            protected={"task": "resource-functions-tasks", "functions": "resource-functions"},
        )

    message = str(refused.value)
    assert f"{prefix!r}" in message and reached in message
    assert "resource-functions-tasks" in message and "resource-functions" in message


def test_the_default_prefix_reaches_neither() -> None:
    provider = KubernetesSecrets(
        None,  # type: ignore[arg-type]
        "concourse-",
        protected={"task": "resource-functions-tasks", "functions": "resource-functions"},
    )
    assert provider.namespace(Build(team="tasks")) == "concourse-tasks"
