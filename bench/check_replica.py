"""One check-service replica for ``bench/check_load.py``: the real service (``create_app``
under gunicorn, as ``python -m functions serve check``), configured from the environment, with
two bench-only parts:

* the runtime is an in-process stand-in (no container): it sleeps ``BENCH_RUN_SECONDS`` like
  a check script would take, prints one version per ``BENCH_COMMIT_SECONDS`` window (so a
  resource gets new commits over time) and hands that stdout to the real ``steps.collect``,
  which records the history as every runtime does. With ``REPLY_MODE=async`` it starts that
  run as a task in a background thread (the tests' ``AsyncRepositoryRuntime``: once per run
  id; after recording, the real ``lease.release_held`` and the reply POSTed to ``K_SINK``);
* the store is wrapped to count its requests (each Store call is one request: every record,
  result and log here is a single PUT or GET).

``GET /bench/counts`` returns ``{"runs": n, "starts": n, "store": {method: n}}`` of this
replica (``starts``: tasks it was asked to start, async replies only).

    python bench/check_replica.py --port 8081     # env: STORE_URL, CACHE_SECRET, ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from functions.http.app import create_app, open_local_or_remote_store
from functions.http.serving import serve
from functions.model import Outcome, Task
from functions.settings import Settings
from storage import Store
from testbed.repository_runtime import AsyncRepositoryRuntime, collect_check

STORE_METHODS = (
    "put", "open", "stat", "delete", "list", "read_record", "write_record",
)  # fmt: skip


class CountingStore:
    """A Store that counts the calls made through it (thread-safe) and forwards them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.url = store.url
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in STORE_METHODS:
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
            return method(*args, **kwargs)

        return counted


class StandInRuntime(AsyncRepositoryRuntime):
    """Runs a check without a container: sleeps, then prints this time window's commit;
    ``start`` runs the same in a background task (``AsyncRepositoryRuntime``)."""

    def __init__(self, store: Any, sink: str, seconds: float, commit_every: float) -> None:
        super().__init__(store, sink, seconds)
        self.commit_every = commit_every
        self.runs = 0

    def run(self, task: Task) -> Outcome:
        with self._lock:
            self.runs += 1
        time.sleep(self.seconds)
        version = {"ref": str(int(time.time() // self.commit_every))}
        return collect_check(self.store, task, json.dumps([version]).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    settings = Settings.from_env()
    store = CountingStore(open_local_or_remote_store(settings))
    runtime = StandInRuntime(
        store,
        settings.sink,
        float(os.environ.get("BENCH_RUN_SECONDS", "0.5")),
        float(os.environ.get("BENCH_COMMIT_SECONDS", "30")),
    )
    app = create_app(settings, "check", store=store, runtime=runtime)  # type: ignore[arg-type]
    app.add_url_rule(
        "/bench/counts",
        "bench-counts",
        lambda: {"runs": runtime.runs, "starts": len(runtime.starts), "store": dict(store.counts)},
    )
    serve(app, host="127.0.0.1", port=args.port, threads=settings.threads)


if __name__ == "__main__":
    main()
