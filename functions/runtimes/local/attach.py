"""The engine's hijacked stream of a container's or an exec's stdio (no TTY): stdin fed and
half-closed, the multiplexed stdout/stderr read into an ``Output``. Used for a task
container's attach and for a warm check's exec alike; ``ENGINE_ERRORS``: what trouble with
the engine raises (each caller makes it ``Unavailable``)."""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

import docker.errors
import requests.exceptions

from functions.runtimes.output import Output

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)
FRAME_HEADER = struct.Struct(">BxxxL")  # stream number, 3 zero bytes, big-endian length


def feed(sock: Any, payload: bytes) -> None:
    raw = getattr(sock, "_sock", sock)
    try:
        raw.sendall(payload)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the script exited or closed stdin without reading it all: its exit code tells


def drain(sock: Any, output: Output) -> None:
    """Read the attach stream (frames of an 8-byte header: stream number, 3 zero bytes,
    big-endian length) to its end into ``output``, which is complete only if the stream
    ended between two frames."""
    raw = getattr(sock, "_sock", sock)
    pending = b""
    try:
        while chunk := raw.recv(1 << 16):
            pending += chunk
            while len(pending) >= FRAME_HEADER.size:
                stream, size = FRAME_HEADER.unpack_from(pending)
                end = FRAME_HEADER.size + size
                if len(pending) < end:
                    break
                output.add(stream, pending[FRAME_HEADER.size : end])
                pending = pending[end:]
    except OSError:
        return  # cut off: left incomplete (the caller decides what to read instead)
    output.complete = not pending


def close_socket(sock: Any) -> None:
    """Close the attach socket; a reader still blocked on it wakes up."""
    raw = getattr(sock, "_sock", sock)
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the engine
    sock.close()


@dataclass(frozen=True)
class Pumping:
    """An attached socket being fed its stdin and drained into ``output`` by two threads."""

    output: Output
    reader: threading.Thread  # ends when the process's streams end
    feeder: threading.Thread


def pump(sock: Any, stdin: bytes, keep: int) -> Pumping:
    """Start feeding ``stdin`` into ``sock`` and draining its streams into an ``Output`` that
    keeps ``keep`` bytes of stderr's tail (``stage_collect.stderr_bytes``)."""
    output = Output(keep)
    reader = threading.Thread(target=drain, args=(sock, output), daemon=True)
    feeder = threading.Thread(target=feed, args=(sock, stdin), daemon=True)
    reader.start()
    feeder.start()
    return Pumping(output, reader, feeder)
