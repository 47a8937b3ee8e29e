"""The task pod's contract: what the function, both runtimes and the in-pod steps (``stage``,
``collect``) agree on. Paths, file names, env names and exit codes are spelled here and
nowhere else.

Layout of the shared build volume (``BUILD_DIR``)::

    /tmp/build/put/NAME         a put's inputs (stage unpacks them), its working directory
    /tmp/build/get/             a get's output directory
    /tmp/build/.task/           what the resource step leaves for collect:
        stage-error             stage's message when an input is missing or unsafe
        stdout, stderr          the script's output streams
        started                 empty; made as the script starts (its mtime: the start)
        exit-code               the script's exit code (TIMED_OUT_EXIT_CODE after a timeout)
        timed-out               the timeout in whole seconds, if the watchdog stopped it
    /secret/stdin               the stdin payload (a Secret), read by resource and collect
    /secret/redact              the values to redact (JSON list), computed by the function
    /secret/resolved            the resolved credential values among them (JSON list)
    /var/run/secrets/resource-functions/store/
                                the store's credentials (the deployment's store Secret, one
                                file per key), mounted into stage and collect only
    /var/run/secrets/resource-functions/reply/reply-token
                                an asynchronous run's token for the reply relay (its
                                stdin Secret's key), mounted into collect only
    /etc/hosts, /etc/resolv.conf
                                in stage and collect: read-only copies of the function's
                                own (keys of the stdin Secret), when it pins them
                                (``functions.runtimes.kube.name_files``); never in resource
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from functions.model import (
    ACTIONS,
    FAILURE_KINDS,
    Action,
    ArtifactRef,
    FailureKind,
    HistoryPlan,
    LeaseHold,
    Phase,
    ReplyAddress,
    TraceContext,
)
from functions.tracing import trace_context
from storage.base import is_digest

MANAGED_BY = "resource-functions"  # the managed-by label of task Jobs and local containers
BUILD_DIR = "/tmp/build"
TASK_SUBDIR = ".task"
TASK_DIR = f"{BUILD_DIR}/{TASK_SUBDIR}"
SECRET_DIR = "/secret"
STDIN_KEY = "stdin"
STDIN_FILE = f"{SECRET_DIR}/{STDIN_KEY}"
# Beside stdin in the same Secret: a JSON list of the values collect redacts (Task.secrets:
# the function applies the policy, REDACT_KEYS included, so collect needs no setting).
REDACT_KEY = "redact"
# And the resolved credential values among them: a version holding one fails the run.
RESOLVED_KEY = "resolved"
# In the same Secret, mounted into collect alone: the run's reply token for the reply relay
# (an asynchronous task's collect posts its events there; the resource image never sees it).
REPLY_TOKEN_KEY = "reply-token"
REPLY_TOKEN_DIR = "/var/run/secrets/resource-functions/reply"
REPLY_TOKEN_FILE = f"{REPLY_TOKEN_DIR}/{REPLY_TOKEN_KEY}"
# In the same Secret, mounted (subPath, read-only) into stage and collect alone: the name
# files they resolve the store and the relay with, which the resource step cannot rewrite.
HOSTS_KEY = "hosts"
RESOLV_CONF_KEY = "resolv.conf"
ETC_HOSTS = "/etc/hosts"
ETC_RESOLV_CONF = "/etc/resolv.conf"
STAGE_ERROR_FILE = "stage-error"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
EXIT_CODE_FILE = "exit-code"
STARTED_FILE = "started"
TIMED_OUT_FILE = "timed-out"  # holding the timeout: the watchdog stopped the script
TIMED_OUT_EXIT_CODE = 124
KILL_AFTER_SECONDS = 2  # from SIGTERM to SIGKILL when the script overruns

# A failed stage or collect step exits 1 (2: its arguments do not parse) and leaves a
# StepFailure as its termination message: whether the request may succeed later (then the
# function deletes the Job and answers 503) and, if not, the failure's kind.
# The kubelet keeps at most 4096 bytes per container, and 12 KiB for the whole pod divided
# among its containers: 2000 leaves room for sidecars a mesh injects.
TERMINATION_MESSAGE_BYTES = 2000

# The env of stage/collect: the store and the sink (collect only, the function's own K_SINK),
# plus the function's own non-secret settings named in STEP_ENV, which the steps need to reach
# the store the way the function does (copied into every task pod's env when set).
STORE_URL_ENV = "STORE_URL"
SINK_ENV = "K_SINK"
# The store Secret reaches stage and collect as files, never as env vars: the resource image
# shares their volume and could otherwise point a file at /proc/self/environ.
STORE_CREDENTIALS_DIR = "/var/run/secrets/resource-functions/store"
STORE_CREDENTIALS_ENV = "STORE_CREDENTIALS_DIR"
REPLY_TOKEN_ENV = "REPLY_TOKEN_FILE"  # collect of an asynchronous task: where its token is
STEP_ENV = (
    "ARCHIVE_FORMAT",
    "ARCHIVE_LEVEL",
    "ARCHIVE_THREADS",
    "ARCHIVE_MAX_ENTRY_BYTES",
    "ARCHIVE_MAX_TOTAL_BYTES",
    "ARCHIVE_MAX_ENTRIES",
    "STORE_PART_SIZE",
    "STORE_CONCURRENCY",
    "S3_ADDRESSING_STYLE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_RETRY_MODE",
    "AWS_REQUEST_CHECKSUM_CALCULATION",
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_CLOUD_PROJECT",
    "LOG_LEVEL",
)


@dataclass(frozen=True)
class StepFailure:
    """Why a pod step failed, as its termination message (JSON): written by the step, read
    by the function's ``job_status``. No secret in it: steps never quote stdin or creds."""

    kind: FailureKind
    retryable: bool
    message: str

    def termination_message(self) -> str:
        """The JSON, at most ``TERMINATION_MESSAGE_BYTES``: the message's tail is kept whole
        (a cut JSON would not parse, and the kind and ``retryable`` would be lost)."""
        message = self.message
        while True:
            body = {"kind": self.kind, "retryable": self.retryable, "message": message}
            text = json.dumps(body)  # ASCII: escapes make a character up to 12 bytes
            over = len(text) - TERMINATION_MESSAGE_BYTES
            if over <= 0:
                return text
            message = message[max(1, over // 12) :]

    @classmethod
    def parse(cls, text: str) -> StepFailure | None:
        """The failure a step reported, or None if ``text`` is not one (a step killed before
        it could write it; the kubelet's fallback of the log's tail)."""
        try:
            body = json.loads(text)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("kind") not in FAILURE_KINDS:
            return None
        retryable, message = body.get("retryable"), body.get("message")
        if not isinstance(retryable, bool) or not isinstance(message, str):
            return None
        return cls(kind=body["kind"], retryable=retryable, message=message)


# Where a task pod spent its time (``StepTimings``): the resource script (from the resource
# step's marker files), from its end to the collect process's start (the kubelet starting the
# container), from there to collect's main (the interpreter and its imports), then collect's
# own steps. Metric label values: a fixed set.
POD_PHASES = ("script", "collect_start", "collect_import", "upload", "history", "store", "reply")


@dataclass(frozen=True)
class StepTimings:
    """A successful collect's termination message (JSON): the pod's ``POD_PHASES`` with
    wall-clock nanoseconds (the node's clock), read by the function into the run's phases."""

    phases: tuple[Phase, ...]

    def termination_message(self) -> str:
        return json.dumps({"phases": [[p.name, p.start_ns, p.end_ns] for p in self.phases]})

    @classmethod
    def parse(cls, text: str) -> StepTimings | None:
        """The timings collect reported, or None if ``text`` is not that."""
        try:
            body = json.loads(text)
        except ValueError:
            return None
        listed = body.get("phases") if isinstance(body, dict) else None
        if not isinstance(listed, list):
            return None
        phases = []
        for item in listed:
            if not (isinstance(item, list) and len(item) == 3 and item[0] in POD_PHASES):
                return None
            name, start, end = item
            if not (type(start) is int and type(end) is int and 0 < start <= end):
                return None
            phases.append(Phase(name, start, end))
        return cls(tuple(phases))


@dataclass(frozen=True)
class ReplyPlan:
    """Asynchronous completion: ``collect`` posts the reply event to ``$K_SINK`` itself."""

    request_id: str
    subject: str | None = None
    sink: str = ""  # the function's own K_SINK: given to the collect container alone
    trace: TraceContext | None = None  # the request's, carried on by the posted events
    team: str = ""  # the request's build.team: the posted events' ``team`` attribute

    def address(self, run_id: str) -> ReplyAddress:
        return ReplyAddress(self.request_id, run_id, self.subject, self.team, self.trace)


def format_input(name: str, ref: ArtifactRef) -> str:
    """The ``--input`` argument of the stage step: ``NAME=KEY[@sha256:HEX]``."""
    return f"{name}={ref.key}@{ref.digest}" if ref.digest else f"{name}={ref.key}"


def parse_input(value: str) -> tuple[str, ArtifactRef]:
    """Inverse of ``format_input``; ``ValueError`` says what is wrong."""
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--input {value!r}: expected NAME=KEY[@sha256:HEX]")
    key, at, digest = rest.rpartition("@")
    if at and is_digest(digest):
        return name, ArtifactRef(key=key, digest=digest)
    return name, ArtifactRef(key=rest)


class StepArgsError(ValueError):
    """The arguments of a pod step do not parse; the message says which and why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise StepArgsError(f"{self.prog}: {message}")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse (before 3.13) drops a value that is exactly "--" even when given as
        # --name=--, so a directory or an event id "--" would come back empty.
        if action.nargs is None and arg_strings == ["--"]:
            return self._get_value(action, "--")
        return super()._get_values(action, arg_strings)


@dataclass(frozen=True)
class StageStep:
    """The ``stage`` step's arguments: unpack a put's inputs into ``directory``. ``argv`` and
    ``parse`` are the two sides of one contract (the pod spec writes, the step reads)."""

    directory: str
    inputs: tuple[tuple[str, ArtifactRef], ...] = ()
    task_dir: str = TASK_DIR

    def argv(self) -> list[str]:
        args = ["stage", _opt("dir", self.directory)]
        args += [_opt("input", format_input(name, ref)) for name, ref in self.inputs]
        if self.task_dir != TASK_DIR:
            args.append(_opt("task-dir", self.task_dir))
        return args

    @classmethod
    def parse(cls, argv: Sequence[str]) -> StageStep:
        """Inverse of ``argv`` (without the leading ``stage``); ``StepArgsError`` if malformed."""
        args = _stage_parser().parse_args(list(argv))
        try:
            inputs = tuple(parse_input(value) for value in args.input)
        except ValueError as err:
            raise StepArgsError(f"stage: {err}") from None
        return cls(directory=args.dir, inputs=inputs, task_dir=args.task_dir)


@dataclass(frozen=True)
class CollectStep:
    """The ``collect`` step's arguments: what to record for run ``run_id`` (and, with
    ``reply``, post to ``$K_SINK``). No secret in it: it is written into the pod spec."""

    run_id: str
    action: Action
    build_dir: str = BUILD_DIR
    stdin_file: str = STDIN_FILE
    cache_key: str | None = None  # get: names the artifact and its cache record
    history: HistoryPlan | None = None  # check: where the versions found are recorded
    lease: LeaseHold | None = None  # async check: released once the outcome is recorded
    reply: ReplyPlan | None = None  # async: post the reply (its sink is given by env)
    request: str = ""  # keys.request_digest: recorded with the result (a keyed hash)

    def argv(self) -> list[str]:
        args = ["collect", _opt("run-id", self.run_id), _opt("action", self.action)]
        if self.request:
            args.append(_opt("request", self.request))
        args += [_opt("dir", self.build_dir), _opt("stdin-file", self.stdin_file)]
        if self.cache_key:
            args.append(_opt("cache-key", self.cache_key))
        if self.history:
            args.append(_opt("history-key", self.history.resource_key))
            args.append(_opt("history-limit", str(self.history.limit)))
        if self.lease:
            args += [_opt("lease-key", self.lease.key), _opt("lease-holder", self.lease.holder)]
        if self.reply:
            args += _reply_argv(self.reply)
        return args

    @classmethod
    def parse(cls, argv: Sequence[str]) -> CollectStep:
        """Inverse of ``argv`` (without the leading ``collect``); ``StepArgsError`` if not."""
        args = _collect_parser().parse_args(list(argv))
        history = HistoryPlan(args.history_key, args.history_limit) if args.history_key else None
        if (args.lease_key is None) != (args.lease_holder is None):
            raise StepArgsError("collect: --lease-key and --lease-holder go together")
        lease = LeaseHold(args.lease_key, args.lease_holder) if args.lease_key else None
        return cls(
            run_id=args.run_id,
            action=cast(Action, args.action),
            build_dir=args.dir,
            stdin_file=args.stdin_file,
            cache_key=args.cache_key,
            history=history,
            lease=lease,
            reply=_reply_of(args),
            request=args.request,
        )


def _opt(name: str, value: str) -> str:
    """``--name=value``: one argument, so a value that starts with ``-`` (an event id may)
    is never read as an option."""
    return f"--{name}={value}"


def _reply_argv(reply: ReplyPlan) -> list[str]:
    args = ["--reply-to-sink", _opt("request-id", reply.request_id)]
    if reply.subject is not None:
        args.append(_opt("subject", reply.subject))
    if reply.trace is not None:
        args.append(_opt("traceparent", reply.trace.traceparent))
        if reply.trace.tracestate:
            args.append(_opt("tracestate", reply.trace.tracestate))
    if reply.team:
        args.append(_opt("team", reply.team))
    return args


def _reply_of(args: argparse.Namespace) -> ReplyPlan | None:
    if not args.reply_to_sink:
        return None
    trace = trace_context(args.traceparent, args.tracestate)
    if args.traceparent is not None and trace is None:
        raise StepArgsError(f"collect: --traceparent {args.traceparent!r} is not valid")
    return ReplyPlan(args.request_id, args.subject, trace=trace, team=args.team)


def _stage_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m functions stage", description="(task pods) unpack inputs")
    parser.add_argument("--dir", required=True, help="the put's working directory")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=KEY[@sha256:HEX]")
    parser.add_argument("--task-dir", default=TASK_DIR)
    return parser


def _collect_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m functions collect", description="(task pods) record")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--action", required=True, choices=ACTIONS)
    parser.add_argument("--dir", default=BUILD_DIR, help="the build dir (/tmp/build)")
    parser.add_argument("--stdin-file", default=STDIN_FILE)
    parser.add_argument("--request", default="", help="the request's digest, kept with its result")
    parser.add_argument("--cache-key")
    parser.add_argument("--history-key", help="check: the resource key of its version history")
    parser.add_argument("--history-limit", type=int, default=1000)
    parser.add_argument("--lease-key", help="async check: its lease, released once recorded")
    parser.add_argument("--lease-holder", help="async check: the nonce of its lease's holding")
    parser.add_argument("--reply-to-sink", action="store_true", help="post the reply to K_SINK")
    parser.add_argument("--request-id", default="")
    parser.add_argument("--subject")
    parser.add_argument("--traceparent", help="the request's: the posted events carry it on")
    parser.add_argument("--tracestate", default="")
    parser.add_argument("--team", default="", help="the request's: the posted events carry it")
    return parser
