"""Hostile CustomRuns fail alone, on the real API server (issue 50, finding 2).

A tenant creates, in its team's namespace, CustomRuns of the Custom Task nested 3,000 levels
deep (in ``customSpec.spec``, a param's value and ``customRef.params``: neither the API
server nor Tekton's webhook refuses them) and three of 1.4 MB. Before, every LIST of the
controller raised RecursionError or ran it out of memory, and another team's ordinary Check
did not succeed within 180 s. Now: the other team's Check succeeds, the controller is not
restarted, and each hostile CustomRun fails alone: the deep ``customSpec.spec`` and the large
ones are ended ``Undecodable`` with a Warning Event; a deep param value is stored by Tekton's
webhook as its JSON text (a ParamValue that is no string, list or flat object becomes a
string), which the controller's params check refuses (``InvalidParams``, nested deeper than
64 levels), and one under ``customRef.params`` is nothing the controller reads. The
controller's peak memory (VmHWM of its processes, read on the node) is printed: the
Deployment's limit is set from it (docs/tekton.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply
from tests.cluster.conftest import NAMESPACE
from tests.cluster.custom_task import CustomTask, condition, custom_task_in
from tests.cluster.node_processes import container_processes
from tests.cluster.secured import LOAD_TEAMS, Secured
from tests.support import tekton_pipelines as pipelines

HOSTILE = LOAD_TEAMS[-1]  # the attacker's team namespace
OTHER = LOAD_TEAMS[-2]  # another team's
TEKTON_NAMESPACES = (HOSTILE, OTHER)  # shown by conftest when a test fails
LARGE = 1400 * 1024
CONTROLLER = "app.kubernetes.io/component=tekton-controller"


@pytest.fixture(scope="module")
def teams(cluster: Cluster, secured: Secured, tekton) -> Iterator[tuple[CustomTask, CustomTask]]:
    with (
        custom_task_in(cluster, secured, HOSTILE) as hostile,
        custom_task_in(cluster, secured, OTHER) as other,
    ):
        yield hostile, other
        cluster.kubectl("-n", HOSTILE, "delete", "customruns", "--all", "--wait=false")


def controller_pods(cluster: Cluster) -> list[dict]:
    listed = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", CONTROLLER, "-o", "json")
    return json.loads(listed)["items"]


def restarts(cluster: Cluster) -> dict[str, int]:
    return {
        p["metadata"]["name"]: sum(
            s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or []
        )
        for p in controller_pods(cluster)
    }


def peak_memory_mib(cluster: Cluster) -> float:
    """The largest VmHWM (peak resident memory) of the controllers' processes, in MiB."""
    peak = 0
    for pod in controller_pods(cluster):
        for status in pod["status"].get("containerStatuses") or []:
            ident = (status.get("containerID") or "").split("//")[-1]
            for proc, _ in container_processes(ident):
                text = (proc / "status").read_text()
                line = next((x for x in text.splitlines() if x.startswith("VmHWM:")), "VmHWM: 0 kB")
                peak = max(peak, int(line.split()[1]))
    return peak / 1024


def create_raw(cluster: Cluster, text: str, folder: Path) -> None:
    """Create an object from its JSON text as a tenant's kubectl does (no client-side
    validation: the text may be deeper than a schema walker goes)."""
    path = folder / f"{uuid.uuid4().hex}.json"
    path.write_text(text)
    cluster.kubectl("create", "--validate=false", "-f", str(path))


def reason_of(cluster: Cluster, namespace: str, name: str) -> str:
    """The Succeeded condition's reason, read with a jsonpath (the object itself is too
    deep for Python's json)."""
    return cluster.kubectl(
        "-n",
        namespace,
        "get",
        "customrun",
        name,
        "-o",
        'jsonpath={.status.conditions[?(@.type=="Succeeded")].reason}',
        check=False,
    ).strip()


def test_hostile_customruns_fail_alone_and_another_teams_check_succeeds(
    teams: tuple[CustomTask, CustomTask], tmp_path: Path, capsys
) -> None:
    hostile, other = teams
    cluster = hostile.cluster
    cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/tekton-controller", "--timeout=300s"
    )
    before = restarts(cluster)
    names = []
    for n, place in enumerate(pipelines.HOSTILE_PLACES):
        names.append(f"deep-{n}")
        create_raw(cluster, pipelines.hostile_custom_run(names[-1], HOSTILE, place), tmp_path)
    for n in range(3):
        names.append(f"large-{n}")
        large = pipelines.large_custom_run(names[-1], HOSTILE, LARGE)
        create_raw(cluster, json.dumps(large), tmp_path)

    name = f"check-{uuid.uuid4().hex[:6]}"
    source = json.dumps({"uri": f"https://git.example/{name}"})
    check = pipelines.custom_run(name, OTHER, {"type": "test", "source": source}, kind="Check")
    apply(cluster, [check])
    done = other.finished("customrun", name, timeout=180)

    assert condition(done).get("status") == "True", condition(done)
    ended = {n: reason_of(cluster, HOSTILE, n) for n in names}
    undecodable = ["deep-0", "large-0", "large-1", "large-2"]  # customSpec.spec, and large
    assert {n: ended[n] for n in undecodable} == dict.fromkeys(undecodable, "Undecodable")
    assert ended["deep-1"] == "InvalidParams", ended  # a param's value, stored as text
    assert ended["deep-2"] not in ("", "Undecodable"), ended  # customRef.params: not read
    warned = cluster.kubectl(
        "-n",
        HOSTILE,
        "get",
        "events",
        "--field-selector",
        "reason=Undecodable",
        "-o",
        "jsonpath={.items[*].involvedObject.name}",
    ).split()
    assert set(warned) == set(undecodable), warned
    after = restarts(cluster)  # no container of a controller pod started again
    assert {pod: after[pod] for pod in after} == {pod: before.get(pod, 0) for pod in after}
    with capsys.disabled():
        print(
            f"\n[tekton] controller peak memory with {len(names)} hostile CustomRuns "
            f"(3 deep, 3 of {LARGE // 1024} KiB) listed and watched: "
            f"{peak_memory_mib(cluster):.0f} MiB (VmHWM)"
        )
