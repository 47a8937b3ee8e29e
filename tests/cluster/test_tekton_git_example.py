"""The shipped git example of the Tekton Custom Task (``knative/tekton/examples/``) on the real
cluster, applied as a user adapts it (their namespace, repository, builder image and the
project image; ``kubectl apply -k``; with sender authentication on, the scheduled check's
EventPolicy too), with Concourse's real git resource, on the ``secured`` deployment
(``authentication-oidc`` on, NetworkPolicies enforced):

- a repository served by ``git daemon`` on the gateway (task pods may reach its port: the
  egress rule a user adds for a private git server); its tests are ``./test.sh``;
- the scheduled check is the example's CronJob, suspended, each tick started as
  ``kubectl create job --from=cronjob/check-app`` (what the schedule does, on the test's
  clock): the first tick discovers the head, whose PipelineRun gets it, runs its tests in the
  fetched tree and pushes the tag ``tested-<commit>``;
- a commit pushed to the daemon is found by the next tick and starts exactly one PipelineRun
  (a third tick finds nothing new and starts none), whose test Task saw that commit's files
  and whose put created its tag in the served repository;
- no PersistentVolumeClaim exists in any namespace, and no Secret holding a store key in the
  pipeline namespace, at any time during these runs.

The example's setup and story are in ``git_example.py``: ``test_kafka_broker.py`` runs the same
on the Kafka Broker, its channel hop a KafkaChannel.

Also the figures of issue 29 (printed; only correctness is asserted): the example's get and
test against the same done Tekton's own way (a clone Task writing into a PVC workspace on a
static hostPath PersistentVolume, then the same test step), first run and re-run of a commit,
after a round of each that is not counted; ``RF_TEKTON_ROUNDS`` rounds (1; 3 by hand), with the
get Service as shipped (min-scale 0: on this cluster it is at zero after 6 s idle) and with
one pod kept (min-scale 1). A benchmark (``bench``): at its smoke size unless ``RF_BENCH=full``
(one round, the shipped scale, no warm-up).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from testbed.kubernetes import Cluster
from testbed.kubernetes.knative import apply, min_scale
from tests.cluster.conftest import NAMESPACE, wait_functions_serve
from tests.cluster.custom_task import CustomTask, condition
from tests.cluster.git_example import (
    USERS,
    Repository,
    a_commit_is_built_once,
    applied_example,
    served_repository,
)
from tests.cluster.secured import Secured
from tests.support.bench import full_size
from tests.support.tekton_pipelines import pipeline_run, tekton_object

TEKTON_NAMESPACES = (USERS,)  # shown by conftest when a test fails
# The module's setup (Knative, Tekton, the component, the example) counts in its first test.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def repository(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repository]:
    with served_repository(tmp_path_factory.mktemp("git-example")) as served:
        yield served


@pytest.fixture(scope="module")
def example(
    cluster: Cluster,
    secured: Secured,
    tekton,
    real_resource_images,
    repository: Repository,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CustomTask]:
    workdir = tmp_path_factory.mktemp("examples")
    with applied_example(cluster, secured, tekton, repository, workdir) as installed:
        yield installed


def test_a_pushed_commit_is_checked_built_tested_and_tagged_with_no_volume_claim(
    example: CustomTask, repository: Repository, secured: Secured
) -> None:
    a_commit_is_built_once(example, repository, secured)


# --- figures: ours against Tekton's own way (a clone into a PVC workspace) ----------------

ROUNDS = int(os.environ.get("RF_TEKTON_ROUNDS", "1"))
# The get Service's min-scale: as shipped, and one pod kept (the smoke size: as shipped).
SCALES = ("0", "1") if full_size() else ("0",)
CLAIM = "bench-src"


def tekton_way(
    repository: Repository, node: str, path: Path, shell: str, clone_image: str
) -> list[dict]:
    """A static hostPath PersistentVolume at ``path`` (this machine is the node), its claim, a
    clone Task (git in the git resource's image) writing into it, the example's test step,
    and their Pipeline."""
    meta = {"namespace": USERS}
    clone = (
        'git clone -q "$(params.repository)" "$(workspaces.src.path)/app"\n'
        'git -C "$(workspaces.src.path)/app" checkout -q "$(params.ref)"\n'
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{USERS}-{CLAIM}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": USERS, "name": CLAIM},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [node],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, **meta},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"{USERS}-{CLAIM}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        tekton_object(
            "Task",
            "clone",
            USERS,
            {
                "params": [{"name": "repository"}, {"name": "ref"}],
                "workspaces": [{"name": "src"}],
                "steps": [
                    {
                        "name": "clone",
                        "image": clone_image,
                        "command": ["/bin/sh", "-ec", clone],
                    }
                ],
            },
        ),
        tekton_object(
            "Task",
            "test-in-place",
            USERS,
            {
                "workspaces": [{"name": "src"}],
                "steps": [
                    {
                        "name": "test",
                        "image": shell,
                        "workingDir": "$(workspaces.src.path)/app",
                        "command": ["/bin/sh", "-ec", "./test.sh"],
                    }
                ],
            },
        ),
        tekton_object(
            "Pipeline",
            "clone-and-test",
            USERS,
            {
                "params": [{"name": "repository"}, {"name": "ref"}],
                "workspaces": [{"name": "src"}],
                "tasks": [
                    {
                        "name": "fetch",
                        "taskRef": {"name": "clone"},
                        "params": [
                            {"name": "repository", "value": "$(params.repository)"},
                            {"name": "ref", "value": "$(params.ref)"},
                        ],
                        "workspaces": [{"name": "src", "workspace": "src"}],
                    },
                    {
                        "name": "test",
                        "runAfter": ["fetch"],
                        "taskRef": {"name": "test-in-place"},
                        "workspaces": [{"name": "src", "workspace": "src"}],
                    },
                ],
            },
        ),
    ]


def ours(example: CustomTask) -> dict:
    """The example's Pipeline without its tag: get, then test (what both ways do)."""
    pipeline = example.get("pipeline", "build")
    spec = pipeline["spec"]
    spec["tasks"] = [t for t in spec["tasks"] if t["name"] != "tag"]
    return tekton_object("Pipeline", "get-and-test", USERS, spec)


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


@dataclass
class Timed:
    wall: float  # created to seen succeeded, polled
    phases: dict[str, float]  # pipeline task -> its run's startTime to completionTime (1 s)


def timed_run(example: CustomTask, name: str, pipeline: str, params: dict, workspace: dict):
    run = pipeline_run(name, USERS, pipeline, params, [{"name": "src", **workspace}])
    started = time.monotonic()
    apply(example.cluster, [run])
    while condition(found := example.get("pipelinerun", name)).get("status") not in (
        "True",
        "False",
    ):
        assert time.monotonic() - started < 600, f"{name} not done: {found.get('status')}"
        time.sleep(0.2)
    wall = time.monotonic() - started
    assert condition(found)["status"] == "True", condition(found)
    phases = {}
    for child in found["status"]["childReferences"]:
        kind = "customrun" if child["kind"] == "CustomRun" else "taskrun"
        status = example.get(kind, child["name"])["status"]
        phases[child["pipelineTaskName"]] = seconds(status["completionTime"]) - seconds(
            status["startTime"]
        )
    return Timed(wall, phases)


def both_ways(
    example: CustomTask, repository: Repository, ref: str, name: str
) -> tuple[Timed, Timed]:
    """Commit ``ref`` got and tested our way (an emptyDir) and Tekton's (the PVC, in a
    ``subPath`` of its own): the PipelineRuns ``ours-<name>`` and ``pvc-<name>``."""
    ours_params = {"ref": ref, "repository": repository.uri}
    mine = timed_run(example, f"ours-{name}", "get-and-test", ours_params, {"emptyDir": {}})
    their_params = {"ref": ref, "repository": repository.uri}
    claim = {"persistentVolumeClaim": {"claimName": CLAIM}, "subPath": name}
    return mine, timed_run(example, f"pvc-{name}", "clone-and-test", their_params, claim)


@pytest.mark.bench
def test_figures_the_example_against_a_clone_into_a_pvc(
    example: CustomTask, repository: Repository, tekton, real_resource_images, tmp_path
) -> None:
    cluster = example.cluster
    apply(cluster, [ours(example)])
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").strip()
    volume = tmp_path / "volume"  # the PersistentVolume's files, gone with the test's tmp
    volume.mkdir(mode=0o777)
    theirs = tekton_way(repository, node, volume, tekton.shell_image, real_resource_images["git"])
    apply(cluster, theirs)
    figures: dict[str, list[Timed]] = {}
    try:
        if full_size():  # a round not counted: the services up, images on the node
            both_ways(example, repository, repository.commit("warm-up"), "warm-up")
        for scale in SCALES:
            # The test cluster scales an idle Service to zero after 6 s, so that its gets
            # wait for a pod; an operator of a busy pipeline keeps one (min-scale 1).
            min_scale(cluster, NAMESPACE, "get", scale)
            wait_functions_serve(cluster, NAMESPACE)
            for round_ in range(ROUNDS):
                ref = repository.commit(f"bench-{scale}-{round_}")  # no get has fetched it
                for attempt in ("first", "rerun"):
                    mine, other = both_ways(example, repository, ref, f"{attempt}-{scale}-{round_}")
                    way = f"{attempt}, get min-scale {scale}"
                    figures.setdefault(f"ours {way}", []).append(mine)
                    figures.setdefault(f"pvc {way}", []).append(other)
    finally:
        min_scale(cluster, NAMESPACE, "get", "0")  # as shipped
        cluster.kubectl("delete", "-n", USERS, "pipelinerun", "-l", "tekton.dev/pipeline=clone-and-test", "--wait=false", check=False)  # fmt: skip
        cluster.kubectl("delete", "-n", USERS, "pvc", CLAIM, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"{USERS}-{CLAIM}", "--wait=false", check=False)
    print(f"\nTekton pipeline: get + test, ours vs a clone into a PVC ({ROUNDS} round(s)):")
    for key, runs in figures.items():
        wall = statistics.median(r.wall for r in runs)
        phase = {p: statistics.median(r.phases[p] for r in runs) for p in runs[0].phases}
        print(f"  {key:34} wall {wall:6.1f} s   phases (1 s resolution) {phase}")
    for way in (k.removeprefix("ours ") for k in figures if k.startswith("ours ")):
        mine = statistics.median(r.wall for r in figures[f"ours {way}"])
        other = statistics.median(r.wall for r in figures[f"pvc {way}"])
        print(f"  {way}: ours / pvc = {mine / other:.2f}x  (pvc / ours = {other / mine:.2f}x)")
    assert all(r.phases.keys() == {"fetch", "test"} for runs in figures.values() for r in runs)
    # A cached get's reply comes back while its request is being posted: never a post that
    # waited for it in vain (the controller posts outside its lock).
    # Every replica's whole log: the leader posts, and a leader change may have come between.
    assert "not posted" not in example.controller_logs(tail=-1)
