"""The two steps around a resource script, shared by every runtime.

``stage`` fills a put's working directory from input artifacts; ``collect`` turns the
script's exit code, stdout and stderr into an ``Outcome``, stores the output directory of a
get as an artifact (plus its cache record), adds what a check found to the resource's
version history (and its ``new`` versions to the reply data), the log and the result record. The container
runtime calls them in-process; on Kubernetes they run in the task pod
(``python -m functions stage|collect``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

from functions import keys
from functions.ledger import history, results
from functions.model import Action, ArtifactRef, HistoryPlan, Outcome, Task
from functions.phases import PhaseClock, timed
from functions.protocol import MAX_STDERR_BYTES
from functions.redaction import Redactor
from functions.steps.outcome import (
    failed,
    final_failure,
    outcome_of_script,
    screened,
    script_timeout,
)
from storage import Store, get_json, put_json
from storage.archive import ArchiveOptions, Limits, suffix_for
from storage.artifacts import download_tree, upload_tree
from storage.base import key_for_url
from storage.store_errors import ArchiveError, ObjectExists, ObjectNotFound, StorageError

FORMAT_NAMES = {"zstd": "tar+zstd", "gzip": "tar+gzip", "none": "tar"}


class StageFailed(Exception):
    """An input artifact is missing or unsafe: a permanent ``storage`` failure."""


@dataclass(frozen=True)
class CollectSpec:
    """What ``collect`` needs besides the script's output; no secrets in it."""

    run_id: str
    action: Action
    cache_key: str | None  # get only
    archive: ArchiveOptions
    history: HistoryPlan | None = None  # check only
    request: str = ""  # keys.request_digest of the request: recorded with the result


def stage(store: Store, inputs: dict[str, ArtifactRef], workdir: Path, limits: Limits) -> None:
    """Unpack each input artifact into ``workdir/<name>``. ``StoreUnavailable`` propagates
    (retryable); a missing or unsafe artifact raises ``StageFailed``. ``limits`` bound the
    whole put: the total bytes and entries are shared by all its inputs."""
    budget = limits
    for name, ref in sorted(inputs.items()):
        target = workdir / name
        target.mkdir(parents=True, exist_ok=True)
        try:
            stats = download_tree(
                store,
                ref.key,
                target,
                expected_digest=ref.digest or known_digest(store, ref.key),
                limits=budget,
            )
        except ObjectNotFound:
            raise StageFailed(f"input {name!r}: artifact {ref.key} does not exist") from None
        except (ArchiveError, ValueError) as err:  # ValueError: not an artifact's suffix
            raise StageFailed(
                f"input {name!r}: {err} (limits apply to all inputs of a put together)"
            ) from None
        left_bytes = budget.max_total_bytes - stats.bytes
        left_entries = budget.max_entries - stats.entries
        if left_bytes <= 0 or left_entries <= 0:
            if name != max(inputs):
                raise StageFailed(
                    f"the inputs of this put exceed {limits.max_total_bytes} "
                    f"bytes or {limits.max_entries} entries together"
                )
            break
        budget = replace(
            budget,
            max_total_bytes=left_bytes,
            max_entries=left_entries,
            max_entry_bytes=min(budget.max_entry_bytes, left_bytes),
        )


def known_digest(store: Store, key: str) -> str | None:
    """The digest recorded for an artifact: its cache record's (a get's output), else the
    store's own (where the backend keeps one). None: the bytes cannot be verified."""
    stem, _, _ = key.rpartition(".tar")
    try:
        record = get_json(store, stem + ".json")
        digest = record.get("artifact", {}).get("digest")
        if isinstance(digest, str) and key_for_url(store, record["artifact"]["url"]) == key:
            return digest
    except (ObjectNotFound, ValueError, KeyError, TypeError, AttributeError):
        pass
    info = store.stat(key)
    return info.digest if info is not None else None


def collect(
    store: Store,
    spec: CollectSpec,
    *,
    exit_code: int,
    stdout: bytes,
    stderr: bytes,
    output_dir: Path | None,
    redactor: Redactor,
    credentials: Redactor,
    clock: PhaseClock | None = None,
) -> Outcome:
    """Build, store and return the outcome of one script run (idempotent per run id).
    ``stderr``: all of it, or its tail with ``redactor.window`` bytes before the last
    ``MAX_STDERR_BYTES`` (``redacted_log``). ``redactor``: of every secret of the run;
    ``credentials``: of its resolved credential values, which no version may hold.
    ``clock`` times the artifact's upload and the store writes."""
    log = redacted_log(stderr, redactor)
    outcome = outcome_of_script(spec.action, exit_code, stdout, log)
    outcome = screened(outcome, redactor, credentials, log)
    if outcome.succeeded and spec.action == "get" and spec.cache_key and output_dir:
        with timed(clock, "upload"):
            outcome = store_artifact(store, spec, outcome, output_dir, log)
    if outcome.succeeded and spec.action == "check" and spec.history:
        stored = results.read_outcome(store, spec.run_id, request=spec.request)
        if stored is not None:  # a redelivered run: its versions are in the history already
            return stored
        with timed(clock, "history"):
            outcome = with_history(store, spec.history, outcome)
    with timed(clock, "store"):
        results.write_once(store, keys.log_key(spec.run_id), log.encode())
        return results.record_outcome(store, spec.run_id, outcome, request=spec.request)


def collect_task(
    store: Store,
    task: Task,
    archive: ArchiveOptions,
    *,
    exit_code: int | None,
    stdout: bytes,
    stderr: bytes,
    redactor: Redactor,
    clock: PhaseClock,
    output_dir: Path | None = None,
) -> Outcome:
    """``collect`` for a runtime that read the script's streams itself (the local runtime's
    containers, warm check containers and pods): an ``exit_code`` of None is a script over
    its timeout (its redacted log stored, a ``timeout`` failure recorded)."""
    if exit_code is None:
        log_text = redacted_log(stderr, redactor)
        results.write_once(store, keys.log_key(task.run_id), log_text.encode())
        return results.record_outcome(
            store,
            task.run_id,
            script_timeout(task.action, task.timeout_seconds, log_text),
            request=task.request_digest,
        )
    spec = CollectSpec(
        run_id=task.run_id,
        action=task.action,
        cache_key=task.cache_key,
        archive=archive,
        history=task.history,
        request=task.request_digest,
    )
    return collect(  # stores the result record
        store,
        spec,
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        redactor=redactor,
        credentials=Redactor(task.resolved),
        output_dir=output_dir,
        clock=clock,
    )


def record_failure(store: Store, task: Task, outcome: Outcome) -> Outcome:
    """A failure the runtime saw, not the script (an image that cannot be had, a task the API
    refused), recorded so that a redelivery replays it; as it is if the store refuses the
    record for good (a refusal that may pass raises ``Unavailable``)."""
    try:
        return results.record_outcome(store, task.run_id, outcome, request=task.request_digest)
    except StorageError as err:
        return final_failure(task.action, err)


def stderr_bytes(redactor: Redactor) -> int:
    """How much of a script's stderr to keep: the log's ``MAX_STDERR_BYTES`` and, before
    them, the redactor's window, so that a secret cut by the tail is still redacted whole."""
    return MAX_STDERR_BYTES + redactor.window


def redacted_log(stderr: bytes, redactor: Redactor) -> str:
    """The stored log: the last ``MAX_STDERR_BYTES`` of ``stderr``, redacted before the cut."""
    return redactor.tail(stderr, MAX_STDERR_BYTES).decode("utf-8", errors="replace")


def store_artifact(
    store: Store, spec: CollectSpec, outcome: Outcome, output_dir: Path, log: str
) -> Outcome:
    """Upload the get's output directory and its cache record; add ``artifact`` to the data."""
    assert spec.cache_key and outcome.data is not None
    if output_dir.is_symlink() or not output_dir.is_dir():
        # The resource wrote it: a link is data, never followed (it could point at the
        # packing process's own secrets).
        what = "a symbolic link" if output_dir.is_symlink() else "not a directory"
        return failed(spec.action, "invalid_output", f"the output directory is {what}", log)
    key = keys.artifact_key(spec.cache_key, suffix_for(spec.archive.format))
    try:
        info = upload_tree(store, key, output_dir, spec.archive)
        digest, size = info.digest, info.size
    except ObjectExists:
        digest, size = describe_existing(store, key)
    except (ArchiveError, OSError) as err:  # OSError: e.g. a file the script left unreadable
        return failed(spec.action, "invalid_output", f"output directory: {err}", log)
    artifact = {
        "url": store.url_for(key),
        "digest": digest,
        "size": size,
        "format": FORMAT_NAMES[spec.archive.format],
    }
    data = {**outcome.data, "artifact": artifact}
    record = {"version": data["version"], "metadata": data["metadata"], "artifact": artifact}
    try:
        put_json(store, keys.cache_record_key(spec.cache_key), record)
    except ObjectExists:
        pass  # a concurrent identical get finished first; its record is as good
    return Outcome(action=spec.action, data={**data, "cached": False})


def with_history(store: Store, plan: HistoryPlan, outcome: Outcome) -> Outcome:
    """A successful check's outcome with ``new``: the versions it found that the resource's
    history did not hold, which are added to it. THE one place where checks update the
    history, whichever runtime ran them (the container runtime in-process, ``collect`` in a
    task pod)."""
    assert outcome.data is not None
    new = history.record_check(store, plan, outcome.data["versions"], now=time.time())
    return replace(outcome, data={**outcome.data, "new": new})


def describe_existing(store: Store, key: str) -> tuple[str, int]:
    """Digest and size of an object already stored (hashes it if the store can't say)."""
    info = store.stat(key)
    if info is not None and info.digest:
        return info.digest, info.size
    digest, size = hashlib.sha256(), 0
    with store.open(key) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return "sha256:" + digest.hexdigest(), size
