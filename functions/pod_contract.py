"""The task pod's contract: what the function, both runtimes and the in-pod steps (``stage``,
``collect``) agree on. Paths, file names, env names and exit codes are spelled here and
nowhere else.

Layout of the shared build volume (``BUILD_DIR``)::

    /tmp/build/put/NAME         a put's inputs (stage unpacks them), its working directory
    /tmp/build/get/             a get's output directory
    /tmp/build/.task/           what the resource step leaves for collect:
        stage-error             stage's message when an input is missing or unsafe
        stdout, stderr          the script's output streams
        exit-code               the script's exit code (TIMED_OUT_EXIT_CODE after a timeout)
        timed-out               the timeout in whole seconds, if the watchdog stopped it
    /secret/stdin               the stdin payload (a Secret), read by resource and collect
    /secret/redact              resolved credential values (JSON list), for collect to redact
"""

from __future__ import annotations

from dataclasses import dataclass

from functions.model import ArtifactRef, TraceContext
from storage.base import is_digest

MANAGED_BY = "resource-functions"  # the managed-by label of task Jobs and local containers
BUILD_DIR = "/tmp/build"
TASK_SUBDIR = ".task"
TASK_DIR = f"{BUILD_DIR}/{TASK_SUBDIR}"
SECRET_DIR = "/secret"
STDIN_KEY = "stdin"
STDIN_FILE = f"{SECRET_DIR}/{STDIN_KEY}"
# Beside stdin in the same Secret: a JSON list of the resolved credential values, which
# collect redacts whatever their length (they are all in stdin already).
REDACT_KEY = "redact"
STAGE_ERROR_FILE = "stage-error"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
EXIT_CODE_FILE = "exit-code"
TIMED_OUT_FILE = "timed-out"  # holding the timeout: the watchdog stopped the script
TIMED_OUT_EXIT_CODE = 124
KILL_AFTER_SECONDS = 2  # from SIGTERM to SIGKILL when the script overruns

# A step that cannot reach the store exits EX_TEMPFAIL, its termination message starting
# with the marker: the function deletes the Job and answers 503 (job_status: "unavailable").
EXIT_UNAVAILABLE = 75
UNAVAILABLE_MARKER = "unavailable:"

# The env of stage/collect: the store and the sink (collect only, the function's own K_SINK);
# the non-secret settings they also get from the function are ``functions.settings.STEP_ENV``.
STORE_URL_ENV = "STORE_URL"
SINK_ENV = "K_SINK"


@dataclass(frozen=True)
class ReplyPlan:
    """Asynchronous completion: ``collect`` posts the reply event to ``$K_SINK`` itself."""

    request_id: str
    subject: str | None = None
    sink: str = ""  # the function's own K_SINK: given to the collect container alone
    trace: TraceContext | None = None  # the request's, carried on by the posted events


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
