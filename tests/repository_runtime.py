"""A runtime stand-in for checks: its "script" lists the commits of an in-memory repository
and hands its stdout to the real ``steps.collect`` (the one path that records the history)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from functions.model import Outcome, Task
from functions.task import steps
from storage import Store
from storage.archive import ArchiveOptions


class RepositoryRuntime:
    """Checks a repository of ``commits``: from a version, that version and the newer ones;
    without one, the latest (as the git resource does). Records what it was given; each run
    takes ``seconds`` (so that checks sent together overlap)."""

    def __init__(self, store: Store, seconds: float = 0.0) -> None:
        self.store = store
        self.seconds = seconds
        self.commits: list[str] = ["1"]
        self.stdins: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def run(self, task: Task) -> Outcome:
        stdin = json.loads(task.stdin)
        with self._lock:
            self.stdins.append(stdin)
        time.sleep(self.seconds)
        ref = (stdin.get("version") or {}).get("ref")
        start = self.commits.index(ref) if ref in self.commits else len(self.commits) - 1
        stdout = json.dumps([{"ref": c} for c in self.commits[start:]]).encode()
        return collect_check(self.store, task, stdout)

    def start(self, task: Task) -> None:
        raise AssertionError("no asynchronous runs here")

    def close(self) -> None:
        pass


def collect_check(store: Store, task: Task, stdout: bytes) -> Outcome:
    """What a runtime does after a check script printed ``stdout`` and exited 0: the real
    ``steps.collect`` (result, log and the history)."""
    spec = steps.CollectSpec(
        run_id=task.run_id,
        action=task.action,
        cache_key=None,
        archive=ArchiveOptions(),
        history=task.history,
    )
    return steps.collect(
        store, spec, exit_code=0, stdout=stdout, stderr=b"", stdin=task.stdin, output_dir=None
    )
