"""A test server as a child process: started, waited for, stopped (one helper for all)."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from functions.cli.launch import NotReady, alive, wait_until

START_TIMEOUT = 30.0


class ServerError(RuntimeError):
    """A test server could not be built or started; the message ends with its output."""


def start(
    name: str,
    command: list[str],
    log: Path,
    ready: Callable[[], bool],
    awaited: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` (output to ``log``) and return it once ``ready()`` holds (``awaited``
    says what that is, for the error); ``ServerError`` with the output if it exits or is not
    ready in time. The caller stops it."""
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would block the server
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(ready, awaited, START_TIMEOUT, alive=partial(alive, process))
    except NotReady as err:
        if process.poll() is None:
            process.kill()
            process.wait()
        output = log.read_text(errors="replace")[-4000:]
        why = (
            f"exited with status {process.returncode}" if "exited" in str(err) else f"did not {err}"
        )
        raise ServerError(f"{name} {why}; its output:\n{output}") from err
    return process


@contextmanager
def running(
    name: str,
    command: list[str],
    ready_url: str,
    log: Path,
    env: Mapping[str, str] | None = None,
) -> Iterator[int]:
    """Run ``command`` (output to ``log``) for the duration of the block, once ``ready_url``
    answers; yields its pid. ``ServerError`` with the output if it exits or does not answer
    in time."""
    process = start(name, command, log, lambda: _answers(ready_url), f"answer {ready_url}", env)
    try:
        yield process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (even 403 to an anonymous request) means it is up
    except OSError:
        return False
