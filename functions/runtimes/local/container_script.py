"""One script in a local container, from its start to its exit code and output: the request
fed on an attach socket's stdin while its stdout and stderr are read as they come, its exit
asked for as soon as the stream ends, the engine's wait as the backstop that enforces the
task's timeout (killing the script), and the engine's logs read instead when the stream did
not end whole or the container was adopted from an earlier delivery.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC, datetime
from typing import Any

import requests.exceptions

from functions.errors import Unavailable
from functions.logs import fields
from functions.model import Task
from functions.runtimes.local.attach import ENGINE_ERRORS, close_socket, pump
from functions.runtimes.output import STDERR, STDOUT, Output

STREAM_END_SECONDS = 5  # after the exit, for the attach stream to bring the last output
EXIT_CHECK_SECONDS = 5  # how often a script whose attach stream goes on is checked for an exit
EXIT_SETTLE_SECONDS = 1  # after the stream's end, asking for the exit code before waiting
log = logging.getLogger("functions.container")


def feed_and_wait(container: Any, task: Task, keep: int) -> tuple[int | None, Output | None]:
    """Start with stdin, stdout and stderr attached: stdin fed from one thread (a script
    that never reads stdin cannot block us), the output read as it comes by another;
    wait. An exit code of None: the script timed out and was killed. The output is None
    if the attach stream did not end whole (then the engine's logs are read instead).
    ``keep``: the bytes of stderr's tail to keep (``stage_collect.stderr_bytes``)."""
    try:
        sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        container.start()
    except ENGINE_ERRORS as err:
        raise Unavailable(f"container engine: cannot start the container: {err}") from err
    pumping = pump(sock, task.stdin, keep)
    try:
        exit_code = _await_exit(container, task, pumping.reader)
    finally:
        pumping.feeder.join(5)
        pumping.reader.join(STREAM_END_SECONDS)
        close_socket(sock)
    return exit_code, pumping.output if pumping.output.complete else None


def _await_exit(container: Any, task: Task, reader: threading.Thread) -> int | None:
    """The exit code, asked for as soon as the attach stream ends (Podman's own wait
    answers up to a second after the exit); the engine's wait decides when the stream
    ends early (a script closing its stdout) or not at all. None: timed out, killed."""
    deadline = time.monotonic() + task.timeout_seconds
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(min(EXIT_CHECK_SECONDS, max(0.0, deadline - time.monotonic())))
        if reader.is_alive() and (code := _exit_code(container)) is not None:
            return code  # exited, but the stream did not end: the engine's logs tell
    if not reader.is_alive():
        settle = min(deadline, time.monotonic() + EXIT_SETTLE_SECONDS)
        while (code := _exit_code(container)) is None and time.monotonic() < settle:
            time.sleep(0.02)  # the stream ended a moment before the engine saw the exit
        if code is not None:
            return code
    return wait(container, deadline - time.monotonic())


def wait(container: Any, timeout: float) -> int | None:
    """The exit code; None if the script overran ``timeout`` (it is killed)."""
    started = time.monotonic()
    try:
        if timeout <= 0:
            raise requests.exceptions.Timeout("the task's time is up")
        status = container.wait(timeout=timeout)
        return int(status.get("StatusCode", -1))
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
        if time.monotonic() - started < timeout * 0.9:
            raise Unavailable(f"container engine: lost the container: {err}") from err
        _kill(container)
        return None
    except ENGINE_ERRORS as err:
        raise Unavailable(f"container engine: {err}") from err


def remaining(container: Any, timeout: float) -> float:
    """What is left of the task's timeout for an adopted container (all of it when the
    engine does not say when it started)."""
    started = str(container.attrs.get("State", {}).get("StartedAt") or "")
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", started)
    if not match or started.startswith("0001"):
        return timeout
    fraction = (match.group(2) or ".0")[:7]
    zone = match.group(3) or "Z"
    moment = datetime.fromisoformat(match.group(1) + fraction + zone.replace("Z", "+00:00"))
    return timeout - (datetime.now(UTC) - moment).total_seconds()


def _exit_code(container: Any) -> int | None:
    """The exit code if the script has exited, else None. Podman says "stopped", with the
    exit code, for the quarter second it takes to clean up before "exited"."""
    try:
        container.reload()
    except ENGINE_ERRORS as err:
        raise Unavailable(f"container engine: {err}") from err
    state = container.attrs.get("State") or {}
    if state.get("Status") not in ("stopped", "exited"):
        return None
    return int(state.get("ExitCode", -1))


def read_logs(container: Any, *, with_stdout: bool, keep: int) -> Output:
    """The output from the engine's logs (an adopted container's, or when the attach
    stream was cut): two reads, one per stream; stdout only if it counts; the last ``keep``
    bytes of stderr."""
    output = Output(keep)
    streams = (STDERR, STDOUT) if with_stdout else (STDERR,)
    try:
        for stream in streams:
            is_stdout = stream == STDOUT
            chunks = container.logs(stdout=is_stdout, stderr=not is_stdout, stream=True)
            for chunk in chunks:
                output.add(stream, chunk)
                if output.stdout_full:
                    break
    except ENGINE_ERRORS as err:
        raise Unavailable(f"container engine: cannot read the output: {err}") from err
    return output


def _kill(container: Any) -> None:
    try:
        container.kill()
    except ENGINE_ERRORS as err:
        log.warning("cannot kill a timed-out container", extra=fields(error=str(err)))
