"""Where a run's time goes on the test cluster, from the sources that have finer timestamps
than Kubernetes objects (whose pod conditions and container states have whole seconds):

- ``PodTimeline``: a watch of a namespace's pods in the test process, which notes when each
  change was seen (to the millisecond): created, bound to the node, ``Succeeded``;
- the functions' JSON log lines (milliseconds): when a request reached a function;
- the API server's audit log (microseconds, ``Cluster.audit_log``): the functions' requests;
- ``StepTimings``, the collect step's termination message (nanoseconds on the node's clock,
  which is this machine's): the script, the collect container's start, its own steps;
- the sink's arrival times, and the Broker's ``knativearrivaltime`` (its ingress's clock).

Every time here is wall-clock seconds since the epoch (the cluster is this machine).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from kubernetes import client, config, watch

from functions.steps.pod_contract import StepTimings

MONOTONIC_TO_WALL = time.time() - time.monotonic()  # for the sink's monotonic arrival times


def wall(monotonic: float) -> float:
    return monotonic + MONOTONIC_TO_WALL


def stamp(text: str) -> float:
    """An RFC 3339 time (any number of fraction digits, ``Z``) as epoch seconds."""
    head, dot, rest = text.rstrip("Z").partition(".")
    fraction = "".join(c for c in rest if c.isdigit())[:6]
    moment = datetime.fromisoformat(head + "+00:00")
    return moment.timestamp() + (float("0." + fraction) if dot and fraction else 0.0)


def admin_api(cluster: Any) -> client.CoreV1Api:
    return client.CoreV1Api(
        config.new_client_from_config(config_file=str(cluster.admin_kubeconfig))
    )


@dataclass
class PodMarks:
    """When the test's watch first saw a pod as created, bound to the node and Succeeded."""

    labels: dict[str, str] = field(default_factory=dict)
    created: float | None = None
    scheduled: float | None = None
    succeeded: float | None = None
    last: dict[str, Any] = field(default_factory=dict)


class PodTimeline:
    """A watch of ``namespace``'s pods in a thread of the test process."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.pods: dict[str, PodMarks] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(
                    self.core.list_namespaced_pod(self.namespace, _preload_content=False).data
                )
                for pod in listed.get("items") or []:
                    self._note(pod)
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                    deserialize=False,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._note(event["raw_object"])
            except Exception:  # noqa: BLE001 - 410 or a cut: list again
                time.sleep(0.2)

    def _note(self, pod: dict[str, Any]) -> None:
        seen = time.time()
        name = pod["metadata"]["name"]
        with self._changed:
            marks = self.pods.setdefault(name, PodMarks())
            marks.labels = pod["metadata"].get("labels") or {}
            marks.created = marks.created or seen
            if (pod.get("spec") or {}).get("nodeName") and marks.scheduled is None:
                marks.scheduled = seen
            if (pod.get("status") or {}).get("phase") == "Succeeded" and not marks.succeeded:
                marks.succeeded = seen
            marks.last = pod
            self._changed.notify_all()

    def wait(self, name: str, what: str, timeout: float = 120) -> PodMarks:
        with self._changed:
            if not self._changed.wait_for(
                lambda: getattr(self.pods.get(name, PodMarks()), what) is not None, timeout
            ):
                raise AssertionError(f"pod {name} not {what} after {timeout}s")
            return self.pods[name]

    def labelled(self, key: str, value: str, timeout: float = 120) -> tuple[str, PodMarks]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for name, marks in self.pods.items():
                    if marks.labels.get(key) == value:
                        return name, marks
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no pod labelled {key}={value} after {timeout}s")
                self._changed.wait(left)


def bare_pod(
    core: client.CoreV1Api, timeline: PodTimeline, image: str, payload: dict
) -> dict[str, float]:
    """A Pod of ``image`` running the get script with ``payload`` as stdin, created through
    the client and followed to ``Succeeded`` by the timeline's watch. Its script notes
    ``/proc/uptime`` (10 ms) before and after: the host's boot clock, which the containers
    share. Returns its marks (wall-clock seconds)."""
    name = f"bare-{time.time_ns() % 10**10}"
    script = (
        "read up _ </proc/uptime; echo start $up; "
        f"printf '%s' '{json.dumps(payload)}' | /opt/resource/in /tmp/get >/dev/null; "
        "read up _ </proc/uptime; echo end $up"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": timeline.namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [{"name": "resource", "image": image, "command": ["sh", "-c", script]}],
        },
    }
    posted = time.time()
    core.create_namespaced_pod(timeline.namespace, pod)
    marks = timeline.wait(name, "succeeded")
    log = core.read_namespaced_pod_log(name, timeline.namespace)
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    ups = dict(line.split() for line in log.splitlines() if line.startswith(("start", "end")))
    core.delete_namespaced_pod(name, timeline.namespace, grace_period_seconds=0)
    assert marks.created and marks.scheduled and marks.succeeded
    return {
        "posted": posted,
        "created": marks.created,
        "scheduled": marks.scheduled,
        "script_start": boot + float(ups["start"]),
        "script_end": boot + float(ups["end"]),
        "succeeded": marks.succeeded,
    }


def pod_timings(pod: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The collect step's ``StepTimings`` of a task pod, by phase: (start, end) seconds."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated") or {}
        if status.get("name") == "collect":
            timings = StepTimings.parse(ended.get("message") or "")
            assert timings is not None, ended
            return {p.name: (p.start_ns / 1e9, p.end_ns / 1e9) for p in timings.phases}
    raise AssertionError(f"no collect container in {pod['metadata']['name']}")


def function_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON log lines of ``kubectl logs --prefix`` output."""
    for line in text.splitlines():
        _, _, body = line.partition("] ")
        if body.startswith("{"):
            try:
                yield json.loads(body)
            except ValueError:
                continue


def request_seen(lines: Iterable[dict[str, Any]], event_id: str) -> dict[str, Any]:
    """The ``request`` log line of an event (when it reached the function)."""
    for line in lines:
        if line.get("message") == "request" and line.get("id") == event_id:
            return line
    raise AssertionError(f"no request line for {event_id}")


def audit_entries(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The audit log's entries from byte ``offset`` on."""
    with path.open("rb") as stream:
        stream.seek(offset)
        return [json.loads(line) for line in stream if line.strip()]


def job_created(entries: Iterable[dict[str, Any]], job: str) -> float:
    """When the API server answered the functions' create of Job ``job``."""
    for entry in entries:
        ref = entry.get("objectRef") or {}
        if (
            entry.get("verb") == "create"
            and ref.get("resource") == "jobs"
            and ref.get("name") == job
        ):
            return stamp(entry["stageTimestamp"])
    raise AssertionError(f"no create of Job {job} in the audit log")


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def percentile(values: Iterable[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def api_requests(entries: list[dict]) -> tuple[Counter, int, int]:
    """The functions' API requests by (verb, resource) (each once, whatever its stages),
    the most watches open at once, and how many function replicas made them."""
    by_id: dict[str, dict] = {}
    for entry in entries:
        by_id.setdefault(entry["auditID"], {}).update({entry["stage"]: entry, "any": entry})
    counts = Counter(
        (e["any"]["verb"], (e["any"].get("objectRef") or {}).get("resource", "?"))
        for e in by_id.values()
    )
    moments = []
    for stages in by_id.values():
        if stages["any"]["verb"] == "watch":
            moments.append((stamp(stages["any"]["requestReceivedTimestamp"]), 1))
            if "ResponseComplete" in stages:
                moments.append((stamp(stages["ResponseComplete"]["stageTimestamp"]), -1))
    open_now = most = 0
    for _, change in sorted(moments):
        open_now += change
        most = max(most, open_now)
    return counts, most, len({e["any"]["sourceIPs"][0] for e in by_id.values()})
