"""The cluster's processes: each started by the cluster (``Cluster.spawn``) or found in the
state file of a cluster whose owner died; how they are stopped, waited for and reported."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


class ClusterError(RuntimeError):
    """A piece of the cluster failed to start; the message ends with its log."""


@dataclass
class Proc:
    """A process of the cluster: started here (``popen``), or found in the state file of a
    cluster whose owner died (``pid`` only, checked against its command line before use)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen | None = None
    stop_signal: int = signal.SIGTERM  # the signal on which it cleans up after itself

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_runs(self.pid, self.name)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None


def processes(file: str) -> Iterator[tuple[Path, bytes]]:
    """``/proc/<pid>`` of each process of this machine with the bytes of its ``file``
    (``cmdline``, ``cgroup``, ...); a process that ends meanwhile is left out."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            yield proc, (proc / file).read_bytes()
        except OSError:
            continue


def pid_runs(pid: int, name: str) -> bool:
    """Process ``pid`` exists and runs the program ``name`` (not a recycled pid)."""
    try:
        argv0 = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name == name


def terminate(proc: Proc, timeout: float = 15.0) -> None:
    """Its stop signal, then SIGKILL after ``timeout``; a found process is checked by pid."""
    if proc.popen is not None:
        if proc.popen.poll() is not None:
            return
        proc.popen.send_signal(proc.stop_signal)
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)
        return
    for sig, wait in ((proc.stop_signal, timeout), (signal.SIGKILL, 5.0)):
        if not proc.alive():
            return
        with contextlib.suppress(OSError):
            os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def wait_ready(proc: Proc, ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``ready`` until it holds; ``ClusterError`` with the log if ``proc`` exits first or
    ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ClusterError(
                f"{proc.name} exited with {proc.returncode} before {what}:\n{tail(proc.log)}"
            )
        try:
            if ready():
                return
        except Exception as err:  # noqa: BLE001 (not ready yet: keep polling)
            last_error = err
        time.sleep(0.2)
    raise ClusterError(
        f"{proc.name}: not {what} after {timeout}s (last probe error: "
        f"{last_error!r}):\n{tail(proc.log)}"
    )


def run(argv: list[str]) -> str:
    """``argv``'s stdout; ``ClusterError`` with its stderr if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
