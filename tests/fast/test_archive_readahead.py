"""ReadAhead: what unpack reads its raw stream through (a thread reading ahead, bounded)."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from storage.archive.pipe import CHUNK
from storage.archive.readahead import ReadAhead
from storage.store_errors import StoreUnavailable


class Source(io.RawIOBase):
    """``data``, then ``error`` (if any) instead of the end; counts the bytes handed out."""

    def __init__(self, data: bytes, error: Exception | None = None) -> None:
        super().__init__()
        self._data, self._error, self.given = data, error, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.given == len(self._data) and self._error is not None:
            raise self._error
        chunk = self._data[self.given : self.given + size]
        self.given += len(chunk)
        return chunk


def read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "archive-read-ahead" and t.is_alive()]


@pytest.mark.parametrize("size", [4099, CHUNK - 1, CHUNK, 3 * CHUNK])
def test_reads_the_same_bytes_in_any_read_size(size: int) -> None:
    data = os.urandom(5 * CHUNK + 123)
    with ReadAhead(Source(data), limit=2 * CHUNK) as ahead:
        got = b"".join(iter(lambda: ahead.read(size), b""))
        assert ahead.read(size) == b""  # the end stays the end
    assert got == data


def test_the_stream_error_comes_after_the_bytes_before_it() -> None:
    data = os.urandom(2 * CHUNK)
    with ReadAhead(Source(data, StoreUnavailable("connection lost")), limit=CHUNK) as ahead:
        assert ahead.read(2 * CHUNK) + ahead.read(2 * CHUNK) == data
        with pytest.raises(StoreUnavailable, match="connection lost"):
            ahead.read(CHUNK)
        with pytest.raises(StoreUnavailable, match="connection lost"):
            ahead.read(CHUNK)  # again: a failed stream never reads as a clean end


def test_it_reads_at_most_its_limit_ahead() -> None:
    source = Source(os.urandom(40 * CHUNK))
    with ReadAhead(source, limit=4 * CHUNK) as ahead:
        ahead.read(CHUNK)
        time.sleep(0.3)
        # 4 queued, 1 being handed to the queue (blocked), 1 read by the caller
        assert source.given <= 6 * CHUNK


def test_closing_early_stops_and_joins_the_thread() -> None:
    source = Source(os.urandom(40 * CHUNK))
    ahead = ReadAhead(source, limit=2 * CHUNK)
    ahead.read(100)
    time.sleep(0.1)  # the thread is now blocked on a full queue
    ahead.close()
    assert read_ahead_threads() == []
    assert source.given < 40 * CHUNK
    assert ahead.read(CHUNK) == b""  # after close: the end at once, no wait on the thread
