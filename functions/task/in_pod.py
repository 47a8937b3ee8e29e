"""The steps that run inside a task pod: ``python -m functions stage|collect`` (see
``functions.runtimes.kube.podspec`` for the pod layout). Thin: the work is ``functions.steps.stage_collect``.

stage: unpack a put's inputs into its working directory. A missing or unsafe input fails the
request, not the pod: its message goes to ``.task/stage-error`` (the resource step then does
nothing and collect reports a ``storage`` failure) and stage exits 0.

collect: turn what the resource step left in ``.task/`` (exit code, stdout, stderr, and
``timed-out`` if its watchdog stopped the script) into the outcome and store it (artifact,
cache record, log, result; a check's versions into the resource's history); release an
asynchronous check's lease (``--lease-key``/``--lease-holder``); for asynchronous
requests, post the reply (and a check's ``version.discovered`` events) to ``$K_SINK``. Exits 0
once the outcome is recorded, whatever it says, with a ``pod_contract.StepTimings`` as its
termination message (where the pod spent its time, which the function adds to the run's
phases); non-zero only when it could not record or post it.

A failed step exits 1 and writes a ``pod_contract.StepFailure`` (its kind, whether it is
retryable as ``errors.classify`` says, its message) as its termination message, which is how
the function learns why a step failed (task pods cannot read logs). A store that cannot be
reached is not the request's fault: retryable, so the function deletes the Job, records
nothing and answers 503, and the request is delivered again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from functions import keys
from functions.errors import ConfigError, SinkRefused, classify, is_retryable
from functions.ledger import lease, results
from functions.model import FailureKind, Outcome, Phase
from functions.phases import PhaseClock
from functions.protocol import MAX_STDIN_BYTES, MAX_STDOUT_BYTES
from functions.redaction import Redactor
from functions.replies import reply_events
from functions.sink import RelayToken, post_events
from functions.steps import stage_collect
from functions.steps.outcome import failed, script_timeout
from functions.steps.pod_contract import (
    EXIT_CODE_FILE,
    REDACT_KEY,
    RESOLVED_KEY,
    STAGE_ERROR_FILE,
    STARTED_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    TASK_SUBDIR,
    TIMED_OUT_FILE,
    CollectStep,
    StageStep,
    StepFailure,
    StepTimings,
)
from functions.task import untrusted_files
from functions.task.step_settings import StepSettings
from storage import Store, open_store
from storage.archive import ArchiveOptions
from storage.store_errors import StorageError

TERMINATION_LOG = Path("/dev/termination-log")  # kubelet mounts it; absent elsewhere


class StepCannotStart(Exception):
    """A step's settings are missing or malformed; ``status`` is its exit status (the
    message is in the termination log already)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def step_settings(prefix: str) -> StepSettings:
    """The step's settings from the task pod's env; ``StepCannotStart`` if they are wrong
    (the message, behind ``prefix``, goes to the termination log as every step failure)."""
    try:
        return StepSettings.from_env(os.environ)
    except ConfigError as err:
        raise StepCannotStart(fail(f"{prefix}: {err}")) from None
    except StorageError as err:  # the store Secret's files: not mounted (yet), unreadable
        raise StepCannotStart(report(prefix, err)) from None


def stage_main(step: StageStep, *, settings: StepSettings) -> int:
    """Unpack the step's inputs into its directory; the exit status of the stage container."""
    directory, task_dir, inputs = Path(step.directory), Path(step.task_dir), dict(step.inputs)
    try:
        store = open_store(settings.store_url, settings.store_options)
        directory.mkdir(parents=True, exist_ok=True)
        stage_collect.stage(store, inputs, directory, settings.limits)
        # The resource image may run as any user, and put scripts write into their inputs
        # (a git commit, a rebase): open the whole staged tree, as a Concourse volume is.
        make_writable_by_all(directory)
    except stage_collect.StageFailed as err:
        return _stage_failed(task_dir, str(err))
    except StorageError as err:
        if is_retryable(err):
            return report("stage: the store is unavailable", err)
        return _stage_failed(task_dir, f"store: {err}")
    except (ValueError, OSError) as err:
        return fail(f"stage: {err}")
    return 0


def _stage_failed(task_dir: Path, message: str) -> int:
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / STAGE_ERROR_FILE).write_text(message + "\n")
    print(f"stage: {message}", file=sys.stderr)
    return 0


def collect_main(args: CollectStep, settings: StepSettings) -> int:
    """Record the outcome (and post the reply); the exit status of the collect container."""
    entered, clock = time.time_ns(), PhaseClock()
    try:
        store = open_store(settings.store_url, settings.store_options)
        try:
            outcome = record(store, args, settings.archive, clock)
        finally:  # recorded, or not at all: either way the check's waiters may go on
            lease.release_held(store, args.lease)
    except StorageError as err:
        prefix = "the store is unavailable" if is_retryable(err) else "cannot record the outcome"
        return report(f"collect: {prefix}", err)
    except (ValueError, OSError) as err:
        return fail(f"collect: cannot record the outcome: {err}")
    if args.reply is not None:
        with clock.phase("reply"):
            status = _post(args, outcome, settings.sink, settings.reply_token)
        if status:
            return status
    _report_timings((*startup_phases(args.build_dir, entered), *clock.phases))
    return 0


def startup_phases(build_dir: str, entered: int) -> list[Phase]:
    """The resource script (its marker files' mtimes), then from its end to this process's
    start (the kubelet starting the collect container), then to ``entered`` (collect's main:
    the interpreter and its imports). Those whose ends are known and in order: the resource
    step may have set its files' times."""
    try:
        with untrusted_files.directory(build_dir, TASK_SUBDIR) as task:
            started = untrusted_files.mtime_ns(task, STARTED_FILE)
            ended = untrusted_files.mtime_ns(task, EXIT_CODE_FILE)
    except untrusted_files.UntrustedFile:
        started = ended = None
    process = process_start_ns()
    marks = (
        ("script", started, ended),
        ("collect_start", ended, process),
        ("collect_import", process, entered),
    )
    return [
        Phase(name, start, end)
        for name, start, end in marks
        if start is not None and end is not None and 0 < start <= end <= entered
    ]


def process_start_ns() -> int | None:
    """When this process started, on the wall clock (``/proc/self/stat``: clock ticks since
    boot, so to 10 ms); None where there is no such file."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
        since_boot = ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        now_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        return time.time_ns() - (now_boot - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _report_timings(phases: tuple[Phase, ...]) -> None:
    if TERMINATION_LOG.exists():
        try:
            TERMINATION_LOG.write_text(StepTimings(phases).termination_message())
        except OSError:
            pass


@dataclass(frozen=True)
class ResourceStepFiles:
    """What the resource step left in ``.task/``, read as data (``untrusted_files``)."""

    stage_error: bytes | None
    exit_code: int | None
    timed_out: bytes | None  # the timeout in whole seconds, if the watchdog stopped the script
    stdout: bytes
    stderr: bytes

    @classmethod
    def read(cls, build_dir: str, stderr_bytes: int) -> ResourceStepFiles:
        """Raises ``UntrustedFile`` naming a file that is not a plain file to read.
        ``stderr``: its last ``stderr_bytes``."""
        with untrusted_files.directory(build_dir, TASK_SUBDIR) as task:
            return cls(
                stage_error=untrusted_files.read_head(task, STAGE_ERROR_FILE, 64 * 1024),
                exit_code=_as_int(untrusted_files.read_head(task, EXIT_CODE_FILE, 64)),
                timed_out=untrusted_files.read_head(task, TIMED_OUT_FILE, 64),
                stdout=untrusted_files.read_head(task, STDOUT_FILE, MAX_STDOUT_BYTES + 1) or b"",
                stderr=untrusted_files.read_tail(task, STDERR_FILE, stderr_bytes) or b"",
            )


def record(
    store: Store, args: CollectStep, archive: ArchiveOptions, clock: PhaseClock | None = None
) -> Outcome:
    """The outcome of what the resource step left behind, stored (first record wins);
    ``clock`` times the upload and the store writes of a script's outcome."""
    stdin_file = Path(args.stdin_file)
    redactor = Redactor(listed_values(stdin_file.with_name(REDACT_KEY)))
    try:
        left = ResourceStepFiles.read(args.build_dir, stage_collect.stderr_bytes(redactor))
    except untrusted_files.UntrustedFile as err:
        return _record_failure(store, args, "runtime", f"the resource step's output: {err}")
    if left.stage_error:  # stage wrote it, or the resource step did: redacted all the same
        message = redactor.redact_text(left.stage_error.decode(errors="replace"))
        return _record_failure(store, args, "storage", message)
    if left.exit_code is None:
        return _record_failure(
            store,
            args,
            "runtime",
            "the resource step recorded no exit code (does the image have /bin/sh?)",
            stage_collect.redacted_log(left.stderr, redactor),
        )
    if left.timed_out is not None:  # the same failure as the container runtime's
        log = stage_collect.redacted_log(left.stderr, redactor)
        outcome = script_timeout(args.action, _as_int(left.timed_out), log)
        message = outcome.failure.message if outcome.failure else ""
        return _record_outcome(store, args, outcome, log or message)
    spec = stage_collect.CollectSpec(
        run_id=args.run_id,
        action=args.action,
        cache_key=args.cache_key,
        archive=archive,
        history=args.history,
        request=args.request,
    )
    return stage_collect.collect(
        store,
        spec,
        exit_code=left.exit_code,
        stdout=left.stdout,
        stderr=left.stderr,
        output_dir=Path(args.build_dir) / "get" if args.action == "get" else None,
        redactor=redactor,
        credentials=Redactor(listed_values(stdin_file.with_name(RESOLVED_KEY))),
        clock=clock,
    )


def listed_values(path: Path) -> list[str]:
    """A JSON list of strings beside stdin, which the function computed (the values to
    redact; the resolved credential values among them); none if absent."""
    try:
        values = json.loads(read_head(path, MAX_STDIN_BYTES) or b"[]")
    except ValueError:
        return []
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _record_failure(
    store: Store, args: CollectStep, kind: FailureKind, message: str, log: str = ""
) -> Outcome:
    return _record_outcome(
        store, args, failed(args.action, kind, message.strip(), log), log or message
    )


def _record_outcome(store: Store, args: CollectStep, outcome: Outcome, log: str) -> Outcome:
    results.write_once(store, keys.log_key(args.run_id), log.encode())
    return results.record_outcome(store, args.run_id, outcome, request=args.request)


def _post(args: CollectStep, outcome: Outcome, sink: str, reply_token: str) -> int:
    assert args.reply is not None
    if not sink:
        return fail(
            "collect: the outcome is stored but --reply-to-sink needs K_SINK, which is "
            "not set (is the SinkBinding ready?)"
        )
    events = reply_events(args.action, outcome, args.reply.address(args.run_id), args.history)
    try:
        post_events(sink, events, RelayToken(args.run_id, reply_token) if reply_token else None)
    except SinkRefused as err:
        return fail(f"collect: the outcome is stored but the sink refused the reply: {err}")
    return 0


def fail(
    message: str, status: int = 1, *, kind: FailureKind = "runtime", retryable: bool = False
) -> int:
    """Report a step failure on stderr and, as a ``StepFailure``, in the termination
    message; exit ``status``."""
    print(message, file=sys.stderr)
    if TERMINATION_LOG.exists():
        try:
            failure = StepFailure(kind=kind, retryable=retryable, message=message)
            TERMINATION_LOG.write_text(failure.termination_message())
        except OSError:
            pass
    return status


def report(prefix: str, err: BaseException) -> int:
    """Report ``err`` as ``errors.classify`` judges it; the step's exit status."""
    verdict = classify(err)
    return fail(f"{prefix}: {verdict.message}", kind=verdict.kind, retryable=verdict.retryable)


def read_head(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes from the start of ``path`` (one of ours: the mounted stdin
    Secret); empty if it does not exist. Files the resource step wrote go through
    ``untrusted_files`` instead."""
    try:
        with path.open("rb") as stream:
            return stream.read(limit)
    except FileNotFoundError:
        return b""


def _as_int(text: bytes | None) -> int | None:
    """The integer in a small file the resource step wrote, or None."""
    try:
        return int(text.strip()) if text and text.strip() else None
    except ValueError:
        return None


def make_writable_by_all(directory: Path) -> None:
    """chmod a+rwX below ``directory``. Symlinks are left alone, to files or to directories
    (os.walk lists the latter among ``dirs``): their mode means nothing, Linux cannot change
    it, and following one would change its target instead."""
    directory.chmod(0o777)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o777)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | 0o666 | (0o111 if mode & 0o100 else 0))
