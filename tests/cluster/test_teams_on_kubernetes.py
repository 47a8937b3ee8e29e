"""Teams share fairly on the real cluster (services on this machine, their tasks as Jobs):
a put of another team's artifact is refused (403) and creates no Job, while the team whose get
produced it puts it, both answered with their team attribute; over ``MAX_RUNS_PER_TEAM`` a
request is 429 with ``Retry-After`` and creates no Job, while another team's runs; a
credentials prefix from which a team name reaches the platform's namespaces, whose Secrets
the functions may read, stops a function at its start in the cluster."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from functions.cli.launch import wait_until
from tests.cluster.conftest import (
    FUNCTIONS_ACCOUNT,
    NAMESPACE,
    STORE_SECRET,
    ClusterDeployment,
    resource_types,
)
from tests.support.events import request_event, send
from tests.support.round_trip import put_across_teams

LABEL = "resource-functions.dev/"
SOURCE = {"uri": "https://git.example.com/repo.git"}


def job_names(deployment: ClusterDeployment, action: str) -> set[str]:
    return {j["metadata"]["name"] for j in deployment.jobs(**{f"{LABEL}action": action})}


def test_a_put_of_another_teams_artifact_is_403_and_creates_no_job(deployment):
    puts = put_across_teams(deployment.services.urls, SOURCE, lambda: job_names(deployment, "put"))
    assert puts.after_refusal == puts.before
    assert len(puts.after - puts.before) == 1


@pytest.fixture(scope="module")
def limited(
    services_in_cluster: Any,
    cluster_images: dict[str, str],
    gateway_registry: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterDeployment]:
    """The services with MAX_RUNS_PER_TEAM=1."""
    types = resource_types(cluster_images["resource"], gateway_registry)
    tmp = tmp_path_factory.mktemp("limited-deployment")
    with services_in_cluster(types, tmp, extra={"MAX_RUNS_PER_TEAM": "1"}) as deployed:
        yield deployed


def check(team: str, **source: Any) -> Any:
    data = {
        "type": "test",
        "source": {**source, "nonce": uuid.uuid4().hex},
        "build": {"team": team},
    }
    return request_event("check", data)


def test_over_the_teams_limit_a_check_is_429_and_creates_no_job(limited):
    url = limited.services.urls["check"]
    before = job_names(limited, "check")
    first: list[Any] = []
    running = threading.Thread(target=lambda: first.append(send(url, check("a", delay=15))))
    running.start()
    try:
        wait_until(lambda: job_names(limited, "check") - before, "team a's first Job", 60)
        with_one = job_names(limited, "check")
        _, _, over = send(url, check("a"))
        after_refusal = job_names(limited, "check")
        status, other_team, _ = send(url, check("b"))
    finally:
        running.join()

    assert over.status_code == 429, over.text
    assert int(over.headers["Retry-After"]) > 0
    assert over.json()["error"]["kind"] == "too_many_runs"
    assert after_refusal == with_one  # no Job for the refused check
    assert status == 200 and other_team.get_extension("team") == "b"
    assert first[0][0] == 200 and first[0][1].get_type().endswith("succeeded")
    assert len(job_names(limited, "check") - before) == 2  # team a's first, team b's


def test_with_no_refusal_a_team_name_would_read_the_task_namespaces_secrets(
    functions_kubeconfig, namespace, gateway_s3
):
    """Why the prefix is checked: the functions may get Secrets in the task namespace (the
    store Secret, every run's stdin Secret), so with ``resource-functions-`` as the prefix
    and no check (``KubernetesSecrets`` given no protected namespaces) team ``tasks`` gets the
    tasks' store key as a ``((var))``, under the shipped RBAC. The same prefix with the
    platform's namespaces protected, as at start, is refused."""
    from functions.credentials.interpolate import Reference
    from functions.credentials.namespace_secrets import KubernetesSecrets
    from functions.errors import ConfigError
    from functions.kube.api import KubeApi, api_client_from_env
    from functions.model import Build

    api = KubeApi(api_client_from_env(str(functions_kubeconfig)), namespace, (5.0, 30.0))
    prefix = "resource-functions-"
    assert prefix + "tasks" == namespace
    unchecked = KubernetesSecrets(api, prefix)
    stolen = unchecked.lookup(Reference(STORE_SECRET, "AWS_SECRET_ACCESS_KEY"), Build(team="tasks"))
    assert stolen == gateway_s3.keys["AWS_SECRET_ACCESS_KEY"]
    with pytest.raises(ConfigError, match=namespace):
        KubernetesSecrets(api, prefix, protected={"task": namespace, "functions": NAMESPACE})


def function_pod(name: str, image: str, tasks: str, prefix: str) -> dict:
    """The check function as a bare Pod in the functions' namespace, under their
    ServiceAccount (so it finds its own namespace as in a Knative Service), with the
    Kubernetes credentials provider and ``prefix``."""
    env = {
        "RUNTIME": "kubernetes",
        "TASK_NAMESPACE": tasks,
        "TASK_IMAGE": image,
        "STORE_URL": "file:///tmp/store",
        "CACHE_SECRET": "prefix-test",
        "WARM_CHECKS": "off",
        "HOST": "0.0.0.0",
        "CREDENTIALS_PROVIDER": "kubernetes",
        "CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX": prefix,
    }
    container = {
        "name": "function",
        "image": image,
        "args": ["serve", "check"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": FUNCTIONS_ACCOUNT,
            "restartPolicy": "Never",
            "containers": [container],
        },
    }


def test_a_prefix_reaching_the_platforms_namespaces_stops_the_function_at_start(
    cluster, cluster_images, namespace
):
    """In the cluster, under the functions' ServiceAccount: with ``resource-`` as the prefix
    (team ``functions`` would be the functions' namespace, team ``functions-tasks`` the task
    namespace) the check function exits at start naming the prefix and both namespaces, the
    functions' own as its pod finds it; the same pod with the shipped ``concourse-`` serves."""
    suffix = uuid.uuid4().hex[:6]
    refused, served = f"prefix-refused-{suffix}", f"prefix-served-{suffix}"
    pods = [
        function_pod(refused, cluster_images["task"], namespace, "resource-"),
        function_pod(served, cluster_images["task"], namespace, "concourse-"),
    ]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    cluster.kubectl("apply", "-f", "-", stdin=listed)
    try:
        cluster.kubectl(
            "-n", NAMESPACE, "wait", "--for=condition=Ready", f"pod/{served}", "--timeout=120s"
        )
        cluster.kubectl(
            "-n",
            NAMESPACE,
            "wait",
            "--for=jsonpath={.status.phase}=Failed",
            f"pod/{refused}",
            "--timeout=120s",
        )
        said = cluster.kubectl("-n", NAMESPACE, "logs", refused)
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", stdin=listed, check=False)

    assert "CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX='resource-' reaches" in said, said
    assert f"the functions namespace '{NAMESPACE}' (team 'functions')" in said, said
    assert f"the task namespace '{namespace}' (team 'functions-tasks')" in said, said
