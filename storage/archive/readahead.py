"""A stream read ahead of its reader by a thread, up to a bound: a download keeps the link busy
while extraction is slower than the link for a while (thousands of small files), instead of
letting it stall and losing that time for good."""

from __future__ import annotations

import queue
import threading
from typing import BinaryIO, Self

from storage.archive.pipe import CHUNK


class ReadAhead:
    """``read(n)`` of ``stream``, which a thread reads ``CHUNK`` bytes at a time, keeping up to
        ``limit`` bytes ready. The thread's exception is raised by the ``read`` that reaches it, and
    by every read after it.
        ``close`` (or leaving the ``with`` block) stops and joins the thread; it does not close
        ``stream``, which belongs to the caller (a read in progress ends first)."""

    def __init__(self, stream: BinaryIO, limit: int, name: str = "archive-read-ahead") -> None:
        self._stream = stream
        self._chunks: queue.Queue[bytes | BaseException] = queue.Queue(max(1, limit // CHUNK))
        self._current, self._offset, self._ended = b"", 0, False
        self._failed: BaseException | None = None  # raised again by every later read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name=name, daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        if self._offset == len(self._current) and not self._next_chunk():
            return b""
        if self._offset == 0 and size >= len(self._current):
            data = self._current  # the whole chunk: no copy
        else:
            data = self._current[self._offset : self._offset + size]
        self._offset += len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._stop.set()
        # A read after close is the end, never a wait on a thread that is gone.
        self._current, self._offset, self._ended = b"", 0, True
        while self._thread.is_alive():  # let a blocked put through, then the thread sees stop
            self._drain()
            self._thread.join(timeout=0.05)
        self._drain()

    def _next_chunk(self) -> bool:
        if self._failed is not None:
            raise self._failed  # never a clean end after a failure
        if self._ended:
            return False
        item = self._chunks.get()
        if isinstance(item, BaseException):
            self._failed = item
            raise item
        self._current, self._offset, self._ended = item, 0, not item
        return bool(item)

    def _fill(self) -> None:
        try:
            while not self._stop.is_set():
                chunk = self._stream.read(CHUNK)
                self._chunks.put(chunk)
                if not chunk:
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the reader, never lost
            self._chunks.put(err)

    def _drain(self) -> None:
        while True:
            try:
                self._chunks.get_nowait()
            except queue.Empty:
                return
