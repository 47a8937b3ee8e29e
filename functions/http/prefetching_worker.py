"""gunicorn's gthread worker, handing a thread only a request whose head has arrived.

gthread gives a connection a thread once it is readable, and the thread then blocks reading
the request line and headers: a client sending its head a byte at a time holds a thread as
long as it likes, and a hundred such clients hold every thread of a replica (no token is
needed to be slow). Here the event loop reads each request's head, without blocking, within
``HEAD_SECONDS`` and ``HEAD_BYTES``, and for a service that takes whole bodies
(``WholeRequestsWorker``, the reply relay) its body too, up to ``MAX_BODY_BYTES`` within
``BODY_SECONDS``, while the bodies it holds (counted by their Content-Length when the head
arrives) stay under ``BODY_BUDGET``; a body past it is the thread's to read. A client not done by then
is answered 408 (431 for a head too large) and closed. Only then does a thread take the connection, its bytes given back to the parser:
a slow client costs a socket and a buffer, never a thread.
"""

from __future__ import annotations

import errno
import selectors
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from functions.events import MAX_BODY_BYTES

HEAD_SECONDS = 10.0  # from the first byte the loop waits for to the end of the head
HEAD_BYTES = 64 * 1024  # gunicorn's own limits on a head are below this
BODY_SECONDS = 10.0  # the head and a whole body together
BODY_BUDGET = 16 * 1024 * 1024  # bodies the loop holds at once (by Content-Length), in all
CHUNK = 65536


def _answer(status: str, body: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    kind = "Content-Type: application/json\r\n" if body else ""
    return (head + kind + "\r\n").encode() + body


TIMED_OUT = _answer(
    "408 Request Timeout",
    b'{"error": {"kind": "invalid_request", "message": "the request timed out"}}',
)
TOO_LARGE = _answer("431 Request Header Fields Too Large")


class Prefetch:
    """What the loop has read of a connection's next request, and until when it may.
    ``reserve(length)``: whether the loop may hold a body of ``length`` bytes (the worker's
    budget); a body it may not hold is the thread's to read."""

    def __init__(self, reserve: Callable[[int], bool], data: bytes = b"") -> None:
        self.data = bytearray(data)
        self.deadline = time.monotonic() + HEAD_SECONDS
        self.reserve = reserve
        self.wanted: int | None = None  # head and body, once the head said how long
        self.reserved = 0  # body bytes held against the worker's budget

    def complete(self) -> bool | None:
        """True once what the thread needs is here; None when it never will be (too large)."""
        if self.wanted is None:
            end = self.data.find(b"\r\n\r\n")
            if end < 0:
                return None if len(self.data) > HEAD_BYTES else False
            length = body_length(bytes(self.data[:end]))
            if length and self.reserve(length):
                self.reserved = length
                self.deadline += BODY_SECONDS - HEAD_SECONDS
            self.wanted = end + 4 + self.reserved
        return len(self.data) >= self.wanted


def body_length(head: bytes) -> int:
    """The Content-Length a head names, if the loop should read that body: 0 for none, a
    chunked one, one over ``MAX_BODY_BYTES`` or one that is no number (the thread reads or
    refuses those)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"transfer-encoding":
            return 0
        if name == b"content-length":
            length = int(value) if value.isdigit() and len(value) <= 12 else 0
    return length if length <= MAX_BODY_BYTES else 0


class PrefetchingWorker(ThreadWorker):  # type: ignore[misc]
    """gthread that reads each request's head in its event loop (module docstring)."""

    whole_bodies = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: deque[Any] = deque()  # connections whose head the loop is reading
        self.held = 0  # body bytes the loop holds, or has room kept for

    def enqueue_req(self, conn: Any) -> None:
        if getattr(conn, "prefetched", None) is not None or self.cfg.is_ssl:
            super().enqueue_req(conn)  # its request is here (or beyond the loop's reach)
            return
        # Bytes a body's drain read ahead (a pipelined request) are read on from, not trusted
        # to hold a whole head.
        ahead = conn.parser.unreader.take_buffered() if _buffered(conn) else b""
        conn.prefetch = Prefetch(self._reserve, ahead)
        if ahead and conn.prefetch.complete():
            self._hand_over(conn)
            return
        conn.sock.setblocking(False)
        self.reading.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._readable, conn))

    def _reserve(self, length: int) -> bool:
        if not self.whole_bodies or self.held + length > BODY_BUDGET:
            return False
        self.held += length
        return True

    def _readable(self, conn: Any, _sock: Any) -> None:
        try:
            chunk = conn.sock.recv(CHUNK)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.prefetch.data += chunk
        try:
            done = conn.prefetch.complete()
        except Exception:  # a head the loop cannot judge: the client's fault, never the loop's
            self.log.exception("prefetch: a request head could not be read")
            done = None
        if done is None:
            self._drop(conn, TOO_LARGE)
        elif done:
            self._unwatch(conn)
            self._hand_over(conn)

    def _hand_over(self, conn: Any) -> None:
        """A thread takes the connection, with the bytes the loop read."""
        self._release(conn)
        conn.prefetched = bytes(conn.prefetch.data)
        conn.data_ready = True
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        """In a thread: the parser first gets the bytes the loop read."""
        prefetched = getattr(conn, "prefetched", None)
        if prefetched is not None:
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(prefetched)
            conn.prefetched = None
        return super().handle(conn)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        for conn in [c for c in self.reading if c.prefetch.deadline <= now]:
            self._drop(conn, TIMED_OUT)

    def _unwatch(self, conn: Any) -> None:
        self.reading.remove(conn)
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass  # closed meanwhile

    def _release(self, conn: Any) -> None:
        """The body room kept for the connection goes back to the budget."""
        self.held -= conn.prefetch.reserved
        conn.prefetch.reserved = 0

    def _drop(self, conn: Any, answer: bytes = b"") -> None:
        """Close a connection that is too slow, too large or gone, before any thread saw it,
        with ``answer`` if its socket takes it at once."""
        self._unwatch(conn)
        self._release(conn)
        if answer:
            try:
                conn.sock.send(answer)
            except OSError:
                pass  # the client is gone or not reading: closed all the same
        self.nr_conns -= 1
        conn.close()


class WholeRequestsWorker(PrefetchingWorker):
    """The same, reading whole bodies too (up to ``MAX_BODY_BYTES``)."""

    whole_bodies = True


def _buffered(conn: Any) -> bool:
    """Whether the parser holds bytes already read (a pipelined request)."""
    parser = getattr(conn, "parser", None)
    return parser is not None and bool(parser.unreader.buf.getvalue())
