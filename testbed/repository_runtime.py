"""A runtime stand-in for checks: its "script" lists the commits of an in-memory repository
and hands its stdout to the real ``stage_collect.collect`` (the one path that records the history);
``AsyncRepositoryRuntime`` also starts them as asynchronous tasks."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from functions.errors import Unavailable
from functions.model import Outcome, Task
from functions.redaction import Redactor
from functions.runtimes.background import end_async_run
from functions.runtimes.warm.pool import WarmCounts
from functions.steps import stage_collect
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

    def start(self, task: Task, ended: Any = None) -> None:
        raise AssertionError("no asynchronous runs here")

    def tasks_waiting(self) -> int:
        return 0

    def ready(self) -> None:
        pass  # runs in this process: nothing else to answer

    def warm_counts(self) -> WarmCounts:
        return WarmCounts()  # no containers: nothing warm

    adopting = True  # False: as a warm check's runtime, which would run a run id twice

    def adopts(self, task: Task) -> bool:
        return self.adopting

    def close(self) -> None:
        pass


def collect_check(store: Store, task: Task, stdout: bytes) -> Outcome:
    """What a runtime does after a check script printed ``stdout`` and exited 0: the real
    ``stage_collect.collect`` (result, log and the history)."""
    spec = stage_collect.CollectSpec(
        run_id=task.run_id,
        action=task.action,
        cache_key=None,
        archive=ArchiveOptions(),
        history=task.history,
    )
    return stage_collect.collect(
        store,
        spec,
        exit_code=0,
        stdout=stdout,
        stderr=b"",
        output_dir=None,
        redactor=Redactor(task.secrets),
        credentials=Redactor(task.resolved),
    )


class AsyncRepositoryRuntime(RepositoryRuntime):
    """Also starts checks, as a runtime does for asynchronous replies: a task per run id
    (however many replicas start it: they share the engine or cluster) that runs in the
    background and ends it as every runtime does (``end_async_run``: the lease let go, the
    reply posted to ``sink``). ``starts``: every task it was asked to start; ``refuse``:
    how many starts raise ``Unavailable`` first (the engine unreachable)."""

    def __init__(self, store: Store, sink: str, seconds: float = 0.0) -> None:
        super().__init__(store, seconds)
        self.sink = sink
        self.starts: list[Task] = []
        self.refuse = 0
        self._tasks: dict[str, threading.Thread] = {}

    def start(self, task: Task, ended: Any = None) -> None:
        with self._lock:
            self.starts.append(task)
            if self.refuse:
                self.refuse -= 1
                raise Unavailable("container engine unreachable")
            if task.run_id in self._tasks:
                return
            thread = threading.Thread(target=self._run_and_reply, args=(task,), daemon=True)
            self._tasks[task.run_id] = thread
        thread.start()

    def _run_and_reply(self, task: Task) -> None:
        end_async_run(self.store, self.sink, task, self.run(task), ended=None)

    def join(self, timeout: float = 60) -> None:
        """Wait for every task started so far."""
        for thread in list(self._tasks.values()):
            thread.join(timeout)
