"""``MAX_RUNS_PER_TEAM`` holds for the Kubernetes runtime's asynchronous start: the get service
over the real KubernetesRuntime (kmock's emulator over HTTP, the real S3 store) creates a
team's Jobs up to its limit and answers the next request 429 without creating its Secret or
Job, while another team's request starts."""

from __future__ import annotations

from typing import Any

from functions.http.app import create_app
from functions.model import ResourceType
from functions.settings import Settings
from tests.support.http_helpers import event, post
from tests.support.kube_emulator import Cluster, api, cluster
from tests.support.kube_node import IMAGE, make_runtime, store

__all__ = ["api", "cluster", "make_runtime", "store"]  # fixtures

SINK = "http://127.0.0.1:9/"  # nothing is posted: no Job ends here


def get(team: str, ref: str) -> Any:
    data = {"type": "git", "source": {"uri": "x"}, "version": {"ref": ref}, "build": {"team": team}}
    return event("get", data, id=f"{team}-{ref}", replymode="async")


def test_an_async_get_over_the_teams_limit_creates_no_job(
    make_runtime: Any, store: Any, cluster: Cluster
) -> None:
    settings = Settings(
        store_url=store.url,
        resource_types={"git": ResourceType(image=IMAGE)},
        cache_secret=b"k" * 32,
        sink=SINK,
        max_runs_per_team=2,
    )
    runtime = make_runtime(sink=SINK)
    functions = create_app(settings, "get", store=store, runtime=runtime).test_client()

    started = [post(functions, get("a", ref)).status_code for ref in ("1", "2")]
    over = post(functions, get("a", "3"))
    other_team = post(functions, get("b", "1"))

    assert started == [202, 202]
    assert over.status_code == 429 and over.headers["Retry-After"]
    assert other_team.status_code == 202
    assert len(cluster.ever("jobs")) == 3 and len(cluster.ever("secrets")) == 3
