"""A rate-limited network link for benchmarks: a network namespace of our own behind a veth pair,
shaped with ``tc tbf`` in both directions (the host's end shapes what goes in, the namespace's
end what comes out). Needs root.

    with shaped_link("1gbit") as link:
        command = [*link.exec_prefix, "versitygw", "--port", f"{link.peer}:7070", ...]
        # this process reaches it at link.peer, over the shaped veth

Everything is removed on leaving the block (also on Ctrl-C; SIGTERM too, once the caller has
made it an exception, as ``exit_on_sigterm`` does). A namespace left by a process that was
killed outright is removed by the next ``shaped_link``: names carry the creator's pid.
Addresses are a free /30 of 10.213.0.0/16, chosen among those no interface here uses.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from types import FrameType

PREFIX = "rfbench"  # namespaces rfbench-<pid>-<n>; veth ends rfb<pid>h<n> / rfb<pid>n<n>
_RATE = re.compile(r"\d+(\.\d+)?[kmg]?bit")
_sequence = count()


@dataclass(frozen=True)
class Link:
    rate: str  # as tc reads it, e.g. "1gbit"
    namespace: str
    host: str  # this end's address
    peer: str  # the namespace's address

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix of a command that must run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace]


def check_rate(text: str) -> str:
    """``text`` as a tc rate (``200mbit``, ``1gbit``, ``1.5gbit``); ``ValueError`` otherwise."""
    rate = text.strip().lower()
    if not _RATE.fullmatch(rate):
        raise ValueError(f"link rate {text!r}: expected a number and kbit, mbit, gbit or bit")
    return rate


@contextmanager
def shaped_link(rate: str) -> Iterator[Link]:
    rate = check_rate(rate)
    remove_stale()
    n = next(_sequence)
    namespace, host_end, peer_end = (
        f"{PREFIX}-{os.getpid()}-{n}",
        f"rfb{os.getpid()}h{n}",
        f"rfb{os.getpid()}n{n}",
    )
    subnet = _free_subnet()
    link = Link(rate, namespace, f"{subnet}.1", f"{subnet}.2")
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", peer_end)
        _ip("link", "set", peer_end, "netns", namespace)
        _ip("addr", "add", f"{link.host}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{link.peer}/30", "dev", peer_end)
        _ip("-n", namespace, "link", "set", peer_end, "up")
        _shape([], host_end, rate)
        _shape(["-n", namespace], peer_end, rate)
        yield link
    finally:
        _remove(namespace, host_end)


def _shape(where: list[str], device: str, rate: str) -> None:
    # A 1 MB burst: at least a 64 KiB GSO packet, and small beside any transfer measured.
    tbf = ["tbf", "rate", rate, "burst", "1mb", "latency", "50ms"]
    _run(["tc", *where, "qdisc", "add", "dev", device, "root", *tbf])


def _remove(namespace: str, host_end: str) -> None:
    """Delete the host's veth end (its peer goes with it, and so the tc qdiscs) and the
    namespace; each is skipped if it is already gone."""
    links = _output(["ip", "-o", "link", "show"])
    if re.search(rf"^\d+: {re.escape(host_end)}@", links, re.MULTILINE):
        _ip("link", "del", host_end)
    if namespace in _namespaces():
        _ip("netns", "del", namespace)


def remove_stale() -> None:
    """Remove the namespaces and veth ends of benchmarks whose process is gone."""
    for namespace in _namespaces():
        match = re.fullmatch(rf"{PREFIX}-(\d+)-(\d+)", namespace)
        if match and not _alive(int(match.group(1))):
            _remove(namespace, f"rfb{match.group(1)}h{match.group(2)}")
    links = _output(["ip", "-o", "link", "show"])
    for pid, n in re.findall(r"^\d+: rfb(\d+)h(\d+)@", links, re.MULTILINE):
        if not _alive(int(pid)):
            _ip("link", "del", f"rfb{pid}h{n}")


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _output(["ip", "netns", "list"]).splitlines() if line]


def _free_subnet() -> str:
    """``10.213.X``: a /24 that no address or route here falls in (of which we use a /30)."""
    used = _output(["ip", "-4", "-o", "addr", "show"]) + _output(["ip", "-4", "route"])
    if re.search(r"\b10\.213\.0\.0/(8|9|1[0-6])\b|\b10\.0\.0\.0/8\b", used):
        raise RuntimeError("10.213.0.0/16 is routed here: no free subnet for a benchmark link")
    for third in range(256):
        if f"10.213.{third}." not in used:
            return f"10.213.{third}"
    raise RuntimeError("no free /24 in 10.213.0.0/16 for a benchmark link")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _output(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def _run(command: list[str]) -> None:
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


def exit_on_sigterm() -> None:
    """Make SIGTERM and SIGHUP raise ``SystemExit``, and SIGINT ``KeyboardInterrupt`` even
    if it was ignored (as for a background job of a script), so ``finally`` blocks clean up."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


LOOPBACK = "loopback"  # no shaping: the server on 127.0.0.1


def parse_links(text: str) -> list[str]:
    """``loopback`` or tc rates, comma-separated; ``ValueError`` naming a bad one."""
    return [part if part == LOOPBACK else check_rate(part) for part in text.split(",")]
