"""The service's log: one JSON line per record, written whole and in order, however many
request threads log at once (none of them waits for another's write)."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from functions.logs import JsonFormatter, LineHandler, fields


class SlowStream(io.StringIO):
    """A stream whose writes take a while and let other threads run meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        threading.Event().wait(0.001)
        return super().write(text)


def test_lines_from_many_threads_are_whole_complete_and_in_order_per_thread() -> None:
    stream = SlowStream()
    handler = LineHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("test-log-lines")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    start = threading.Barrier(16)

    def requests(thread: int) -> None:
        start.wait()
        for n in range(50):
            log.info("request", extra=fields(thread=thread, n=n))

    threads = [threading.Thread(target=requests, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 16 * 50
    for thread in range(16):
        assert [line["n"] for line in lines if line["thread"] == thread] == list(range(50))
    assert stream.writes < len(lines)  # lines queued during a write went out together


def test_a_stream_that_fails_does_not_fail_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging, "raiseExceptions", False)
    handler = LineHandler(io.StringIO())
    handler.stream.close()
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "message", None, None))
