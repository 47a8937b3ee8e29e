"""A script's two output streams, kept apart and bounded: stdout's head (one byte over the
protocol's limit, so an oversize is detected) and stderr's tail (where errors are), raw:
the caller redacts it, with the bytes before the log's own tail as context
(``steps.stderr_bytes``). Memory stays bounded whatever the script prints; the caller keeps
reading to the end, so a script never blocks on a full pipe."""

from __future__ import annotations

from collections import deque

from functions.protocol import MAX_STDERR_BYTES, MAX_STDOUT_BYTES

STDOUT, STDERR = 1, 2  # the stream numbers of the Docker API's multiplexed stream


class Output:
    def __init__(self, stderr_bytes: int = MAX_STDERR_BYTES) -> None:
        self.complete = False  # set by the reader that saw the stream end whole
        self._stderr_bytes = stderr_bytes
        self._stdout = bytearray()
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0

    def add(self, stream: int, data: bytes) -> None:
        if stream == STDOUT:
            room = MAX_STDOUT_BYTES + 1 - len(self._stdout)
            if room > 0:
                self._stdout += data[:room]
        elif stream == STDERR:
            self._stderr.append(data)
            self._stderr_size += len(data)
            while self._stderr_size - len(self._stderr[0]) >= self._stderr_bytes:
                self._stderr_size -= len(self._stderr.popleft())

    @property
    def stdout_full(self) -> bool:
        return len(self._stdout) > MAX_STDOUT_BYTES

    @property
    def stdout(self) -> bytes:
        return bytes(self._stdout)

    @property
    def stderr(self) -> bytes:
        return b"".join(self._stderr)[-self._stderr_bytes :]
