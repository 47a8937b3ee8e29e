"""The shipped git example of the Tekton Custom Task (``knative/tekton/examples/``) as a user
adapts and applies it, shared by the modules that run it (on the in-memory channel:
``test_tekton_git_example.py``; on the Kafka Broker with a KafkaChannel:
``test_kafka_broker.py``):

    served_repository(root) -> Repository          a repository served by ``git daemon``
    applied_example(cluster, secured, tekton, repository, workdir, channel) -> CustomTask
    a_commit_is_built_once(example, repository, secured)   the example's whole story
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testbed.git_daemon import git_daemon
from testbed.git_history import make_repository
from testbed.kubernetes import GATEWAY, Cluster
from tests.cluster.conftest import NAMESPACE, wait_ready
from tests.cluster.custom_task import (
    CustomTask,
    NoClaims,
    NoStoreKeys,
    condition,
    custom_task_in,
)
from tests.cluster.secured import PIPELINE_TEAMS, Secured
from tests.support.git_server import git

USERS = PIPELINE_TEAMS[1]  # the example's tekton-main, as a user renames it: its team
EXAMPLES = Path(__file__).resolve().parents[2] / "knative" / "tekton" / "examples"
LISTENER = "new-versions"
CHECK = "check-app"
NEW_VERSIONS = "new-versions-to-tekton"  # the Trigger, the channel and the Subscription
# The app's history under its two files, in MiB (bench/README.md: T2 with 50 by hand).
REPO_MB = int(os.environ.get("RF_TEKTON_REPO_MB", "0"))
TEST_SH = '#!/bin/sh\nset -e\ntest -s VERSION\necho "tests of version $(cat VERSION) passed"\n'
IN_MEMORY_CHANNEL = {"apiVersion": "messaging.knative.dev/v1", "kind": "InMemoryChannel"}


@dataclass
class Repository:
    uri: str  # git://<gateway>:<port>/app.git
    served: Path  # the bare repository the daemon serves
    work: Path  # a clone to commit from

    def commit(self, version: str) -> str:
        """Commit VERSION=version and push it to the daemon; the new head."""
        (self.work / "VERSION").write_text(f"{version}\n")
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", f"version {version}", cwd=self.work)
        git("push", "-q", "origin", "main", cwd=self.work)
        return self.head()

    def head(self) -> str:
        return git("rev-parse", "main", cwd=self.served).strip()

    def tag(self, name: str) -> str:
        found = git("tag", "--list", name, cwd=self.served).strip()
        return git("rev-list", "-n", "1", name, cwd=self.served).strip() if found else ""


@contextmanager
def served_repository(root: Path) -> Iterator[Repository]:
    """The app's repository under ``root``: ``test.sh`` and ``VERSION`` on top of
    ``RF_TEKTON_REPO_MB`` of a source tree's history (testbed/git_history.py; none by default),
    served by ``git daemon`` on the gateway while the context lasts."""
    work = root / "work"
    make_repository(root / "app.git", REPO_MB, "source")  # 0: an empty repository
    git("clone", "-q", str(root / "app.git"), str(work), cwd=root)
    git("checkout", "-q", "-B", "main", cwd=work)  # an empty clone's branch is git's default
    (work / "test.sh").write_text(TEST_SH)
    (work / "test.sh").chmod(0o755)
    (work / "VERSION").write_text("1\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "version 1", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    with git_daemon(root, GATEWAY) as port:
        uri = f"git://{GATEWAY}:{port}/app.git"
        git("remote", "set-url", "origin", uri, cwd=work)
        yield Repository(uri, root / "app.git", work)


def on_channel(docs: list[dict], channel: dict[str, str]) -> list[dict]:
    """The example's documents with its InMemoryChannel (the object and the references to
    it) of the kind ``channel`` names instead (apiVersion, kind), as the example says to do
    where events must survive a restart."""

    def swap(ref: dict) -> None:
        if ref.get("kind") == IN_MEMORY_CHANNEL["kind"]:
            ref.update(channel)

    for doc in docs:
        swap(doc)
        spec = doc.get("spec", {})
        swap(spec.get("channel", {}))
        swap(spec.get("subscriber", {}).get("ref", {}))
    return docs


@contextmanager
def applied_example(
    cluster: Cluster,
    secured: Secured,
    tekton,
    repository: Repository,
    workdir: Path,
    channel: dict[str, str] = IN_MEMORY_CHANNEL,
) -> Iterator[CustomTask]:
    """The user namespace, and the example adapted and applied with ``kubectl apply -k``
    (and its EventPolicy for the scheduled check, as sender authentication is on; its channel
    hop on ``channel``); the CronJob suspended, so that only the test's ticks check. Deleted
    again at the end, with the listener's PipelineRuns."""
    with custom_task_in(cluster, secured, USERS) as installed:
        copy = workdir / "examples"
        shutil.copytree(EXAMPLES, copy)
        for path in copy.glob("*.yaml"):
            text = (
                path.read_text()
                .replace("tekton-main", USERS)
                .replace("git://git.example/app.git", repository.uri)
                .replace("docker.io/library/python:3.12-slim", tekton.shell_image)
            )
            path.write_text(text)
        hop = copy / "new-versions.yaml"
        docs = on_channel(list(yaml.safe_load_all(hop.read_text())), channel)
        hop.write_text(yaml.safe_dump_all(docs))
        base = secured.deployment.overlay.parent / "knative" / "kustomization.yaml"
        kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
        kustomization["images"] = yaml.safe_load(base.read_text())["images"]
        kustomization["resources"].append("scheduled-check-policy.yaml")
        (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        cluster.kubectl("apply", "-k", str(copy))
        suspend = json.dumps({"spec": {"suspend": True}})
        cluster.kubectl("-n", NAMESPACE, "patch", "cronjob", CHECK, "-p", suspend)
        wait_ready(
            cluster,
            NAMESPACE,
            [
                f"sinkbinding/{CHECK}",
                f"trigger/{NEW_VERSIONS}",
                f"subscription/{NEW_VERSIONS}",
            ],
        )
        wait_ready(cluster, USERS, [f"eventlistener/{LISTENER}"], timeout=180)
        try:
            yield installed
        finally:
            # Gone before another module applies the example again (on another channel kind:
            # a Subscription's channel cannot change), with the listener's PipelineRuns.
            cluster.kubectl("-n", USERS, "delete", "pipelinerun", "--all", check=False)
            cluster.kubectl(
                "delete", "-k", str(copy), "--ignore-not-found", "--timeout=180s", check=False
            )


def tick(example: CustomTask, name: str) -> dict:
    """One scheduled check, started from the CronJob; its reply's data once answered."""
    example.cluster.kubectl("-n", NAMESPACE, "create", "job", name, f"--from=cronjob/{CHECK}")
    replies = example.deployment.sink.wait(
        requestid=name, type="dev.resourcefunctions.check.succeeded", timeout=300
    )
    return replies[0].get_data()


def runs_of(example: CustomTask, ref: str) -> list[dict]:
    """The listener's PipelineRuns whose ``ref`` param is ``ref``."""
    selector = f"triggers.tekton.dev/eventlistener={LISTENER}"
    return [
        run
        for run in example.list("pipelinerun", selector)
        if {"name": "ref", "value": ref} in run["spec"].get("params", [])
    ]


def built(example: CustomTask, ref: str, timeout: float = 420) -> dict:
    """The one PipelineRun of ``ref``, finished and succeeded."""
    deadline = time.monotonic() + timeout
    while not (found := runs_of(example, ref)):
        if time.monotonic() > deadline:
            pytest.fail(f"no PipelineRun for {ref}\n{example.controller_logs()}")
        time.sleep(1)
    (run,) = found
    run = example.finished("pipelinerun", run["metadata"]["name"], timeout=timeout)
    assert condition(run)["status"] == "True", (condition(run), example.controller_logs())
    return run


def printed_by_tests(example: CustomTask, run: dict) -> str:
    """What the test step of ``run`` printed."""
    (child,) = [c for c in run["status"]["childReferences"] if c["pipelineTaskName"] == "test"]
    task_run = example.get("taskrun", child["name"])
    return example.cluster.kubectl(
        "-n", USERS, "logs", task_run["status"]["podName"], "-c", "step-test"
    )


def a_commit_is_built_once(
    example: CustomTask, repository: Repository, secured: Secured, ticks: str = "tick"
) -> None:
    """The example's story: the first tick's head is got, tested and tagged by one
    PipelineRun; a pushed commit is found by the next tick and built by exactly one more; a
    third tick finds nothing new and starts none. Meanwhile no PersistentVolumeClaim exists
    anywhere and no Secret holding a store key in the pipeline namespace. The ticks' Jobs are
    ``<ticks>-1`` to ``-3`` (their names are the requests' ids: one per session's sink)."""
    store_keys = NoStoreKeys(example.cluster, secured.deployment.s3.keys, (USERS,))
    with NoClaims(example.cluster) as claims, store_keys:
        first = repository.head()
        assert tick(example, f"{ticks}-1")["versions"] == [{"ref": first}]
        run = built(example, first)
        assert "tests of version 1 passed" in printed_by_tests(example, run)
        assert repository.tag(f"tested-{first}") == first

        second = repository.commit("2")
        assert {"ref": second} in tick(example, f"{ticks}-2")["versions"]
        run = built(example, second)
        assert "tests of version 2 passed" in printed_by_tests(example, run)
        assert repository.tag(f"tested-{second}") == second

        tick(example, f"{ticks}-3")  # nothing new: no PipelineRun
        time.sleep(5)  # what a new version would have started by now, it would have
        assert len(runs_of(example, second)) == 1
        listener = example.list("pipelinerun", f"triggers.tekton.dev/eventlistener={LISTENER}")
        assert len(listener) == 2, [r["metadata"]["name"] for r in listener]
    assert claims.polls > 10 and claims.seen == set(), claims.seen
    assert store_keys.polls > 10 and store_keys.found == {}, store_keys.found
