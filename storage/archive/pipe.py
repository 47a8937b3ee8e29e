"""A readable stream fed by a background thread through an OS pipe.

``pack`` uses it to produce the archive while the caller uploads it; ``unpack`` to read and
decompress the raw stream while the caller extracts. The pipe bounds memory (about 1 MiB in
flight) and gives the two threads the hand-off they need: the reader blocks until data comes,
the writer until there is room, closing the read end makes the writer fail with EPIPE at
once (so stopping early never deadlocks), and closing the write end is the end of stream.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

CHUNK = 1 << 20  # pipe and buffer size: large chunks keep syscalls and thread switches rare


class WaitClock:
    """Seconds one end of the pipe has spent blocked in the pipe, a wait in progress included.

    Timed by that end's thread (``with clock:`` around each pipe call), read by any thread:
    the state is one tuple, replaced whole, so a reader never sees half an update."""

    def __init__(self) -> None:
        self._state: tuple[float, float | None] = (0.0, None)  # (total, waiting since)

    def __enter__(self) -> None:
        self._state = (self._state[0], time.perf_counter())

    def __exit__(self, *exc: object) -> None:
        total, since = self._state
        self._state = (total + time.perf_counter() - (since or 0.0), None)

    def seconds(self, now: float) -> float:
        total, since = self._state
        return total + (now - since if since is not None else 0.0)


class Waits:
    """How long each end waited for the other: the writer for room (the reader is slower),
    the reader for data (the writer is slower). ``ARCHIVE_LEVEL=auto`` steers by them."""

    def __init__(self) -> None:
        self.writer, self.reader = WaitClock(), WaitClock()


class PipeSink:
    """The writer's end: collects small writes into large pipe writes; ``tell`` counts bytes;
    ``waits`` times both ends' blocking."""

    def __init__(self, fd: int, waits: Waits) -> None:
        self._fd, self._buffer, self._position = fd, bytearray(), 0
        self.waits = waits

    def write(self, data: Any) -> int:
        size = len(data)
        self._position += size
        if not self._buffer and size >= CHUNK:
            with self.waits.writer:
                write_all(self._fd, data)
            return size
        self._buffer += data
        if len(self._buffer) >= CHUNK:
            self.flush()
        return size

    def flush(self) -> None:
        with self.waits.writer:
            write_all(self._fd, self._buffer)
        self._buffer.clear()

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        """Flush only: the pipe itself belongs to the thread that runs the producer."""
        self.flush()


@contextlib.contextmanager
def background_stream(produce: Callable[[PipeSink], None], name: str) -> Iterator[BinaryIO]:
    """Run ``produce(sink)`` in a thread; yield a buffered stream of what it writes.

    ``read(n)`` returns ``n`` bytes until the end. If ``produce`` raises, the stream's
    reader gets that exception instead of the end of stream; if the reader never got that
    far, it is raised on leaving the block (unless the block itself raised, which wins).
    Leaving the block always stops and joins the thread.
    """
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError):  # a bigger pipe means fewer thread switches; optional
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, CHUNK)
    waits = Waits()
    producer = _Producer(produce, write_fd, name, waits)
    stream = io.BufferedReader(_PipeReader(read_fd, producer, waits.reader), CHUNK)
    producer.start()
    try:
        yield stream
    except BaseException:
        with contextlib.suppress(Exception):  # the caller's exception matters more
            stream.close()
        raise
    stream.close()


class _Producer(threading.Thread):
    """Runs ``produce`` into the pipe; keeps the exception that stopped it for the reader."""

    def __init__(
        self, produce: Callable[[PipeSink], None], fd: int, name: str, waits: Waits
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._produce, self._fd, self._waits = produce, fd, waits
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            sink = PipeSink(self._fd, self._waits)
            self._produce(sink)
            sink.flush()
        except BaseException as err:  # noqa: BLE001 - handed to the reader, never lost
            self.error = err
        finally:
            os.close(self._fd)  # the reader sees end of stream, then checks ``error``


class _PipeReader(io.RawIOBase):
    """The read end of the pipe; turns the producer's failure into the reader's exception."""

    def __init__(self, fd: int, producer: _Producer, waits: WaitClock) -> None:
        super().__init__()
        self._fd, self._producer, self._reported, self._waits = fd, producer, False, waits

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with self._waits:
            count = os.readv(self._fd, [buffer])
        if count == 0:
            self._producer.join()
            self._raise_failure(early_close=False)
        return count

    def close(self) -> None:
        if self.closed:
            return
        os.close(self._fd)  # a producer blocked on the pipe now fails with EPIPE
        self._producer.join()
        super().close()
        if not self._reported:
            self._raise_failure(early_close=True)

    def _raise_failure(self, early_close: bool) -> None:
        error = self._producer.error
        if error is None or (early_close and isinstance(error, BrokenPipeError)):
            return  # EPIPE after the reader closed early is how the producer was stopped
        self._reported = True
        raise error


def write_all(fd: int, data: Any) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
