"""Clients that send their requests a byte at a time: what may hold a server's threads.

trickle = Trickle(url, count, prefix, rest, gap)  # connections sending slowly meanwhile
trickle.answers(timeout)                          # each one's status line, once answered
trickle.close()
"""

from __future__ import annotations

import socket
import threading


class Trickle:
    """``count`` connections each sending ``prefix`` and then one byte of ``rest`` every
    ``gap`` seconds, for as long as the test runs."""

    def __init__(self, url: str, count: int, prefix: bytes, rest: bytes, gap: float) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conns = [socket.create_connection((host, int(port))) for _ in range(count)]
        for conn in self.conns:
            conn.sendall(prefix)
        self.rest, self.gap = rest, gap
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self) -> None:
        for byte in self.rest:
            if self.stop.wait(self.gap):
                return
            for conn in self.conns:
                try:
                    conn.send(bytes([byte]))
                except OSError:
                    pass  # closed by the server: its deadline

    def answers(self, timeout: float) -> list[bytes]:
        """Each connection's status line, once it is answered (b"" if it is not)."""
        found = []
        for conn in self.conns:
            conn.settimeout(timeout)
            try:
                found.append(conn.recv(4096).split(b"\r\n", 1)[0])
            except OSError:
                found.append(b"")
        return found

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.conns:
            conn.close()
