"""Teams share fairly on the real cluster (services on this machine, their tasks as Jobs):
a put of another team's artifact is refused (403) and creates no Job, while the team whose get
produced it puts it, both answered with their team attribute; over ``MAX_RUNS_PER_TEAM`` a
request is 429 with ``Retry-After`` and creates no Job, while another team's runs."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from functions.cli.launch import wait_until
from tests.cluster.conftest import ClusterDeployment, resource_types
from tests.support.events import request_event, send

LABEL = "resource-functions.dev/"
SOURCE = {"uri": "https://git.example.com/repo.git"}


def job_names(deployment: ClusterDeployment, action: str) -> set[str]:
    return {j["metadata"]["name"] for j in deployment.jobs(**{f"{LABEL}action": action})}


def test_a_put_of_another_teams_artifact_is_403_and_creates_no_job(deployment):
    ref = f"t-{uuid.uuid4().hex[:8]}"
    get = {"type": "test", "source": SOURCE, "version": {"ref": ref}, "build": {"team": "a"}}
    status, got, _ = send(deployment.services.urls["get"], request_event("get", get))
    assert status == 200 and got.get_type().endswith("succeeded"), got.get_data()
    assert got.get_extension("team") == "a"
    put = {
        "type": "test",
        "source": SOURCE,
        "params": {"input": "repo"},
        "inputs": {"repo": got.get_data()["artifact"]["url"]},
    }
    before = job_names(deployment, "put")

    _, _, refused = send(
        deployment.services.urls["put"], request_event("put", {**put, "build": {"team": "b"}})
    )
    after_refusal = job_names(deployment, "put")
    status, reply, _ = send(
        deployment.services.urls["put"], request_event("put", {**put, "build": {"team": "a"}})
    )

    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["kind"] == "input_not_allowed"
    assert "'repo'" in refused.json()["error"]["message"]
    assert after_refusal == before
    assert status == 200 and reply.get_type().endswith("succeeded"), reply.get_data()
    assert reply.get_extension("team") == "a"
    assert len(job_names(deployment, "put") - before) == 1


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
