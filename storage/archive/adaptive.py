"""``ARCHIVE_LEVEL=auto``: a zstd level that follows the bottleneck, steered by the pipe's waits.

``pack``'s compressor writes into a pipe that the uploader reads (``archive/pipe.py``). When
the compressor waits for room in the pipe, the uploader is not reading: every upload slot is
busy, the link is the limit, and a higher level spends idle CPU to send fewer bytes. When the
compressor never waits, it is the limit, and a lower level is faster. (The uploader's own
waits cannot tell the two apart: it waits for the compressor while it fills each part, even
when the link is the limit, because a part is bigger than the pipe.)

``next_control`` decides from the compressor's waits over windows of ``WINDOW_SECONDS``, with
hysteresis: it raises the level only when the time the compressor waited would still cover the
next level's extra cost (``_COST``) with a margin to spare, the machine had idle CPU to pay
that cost (a compressor can wait on an uploader that is short of CPU itself, as when the
server runs on the same cores: a higher level then only takes CPU from it), and the data
compresses at all (no level shrinks random bytes); it lowers the level only when the
compressor (almost) never waited; it holds it in between, and changes only after ``STREAK``
windows in a row agree. Idle CPU is the machine's (``/proc/stat``): a CPU limit of the
process's own cgroup is not seen, and a level it cannot afford is lowered again.

A change ends the zstd frame and starts the next one at the new level. A zstd stream may be
any number of frames back to back (RFC 8878, section 3.1): ``unpack``, ``zstd -d`` and ``tar
--zstd`` read them as one stream, and the artifact's digest and size are those of the stored
bytes, as at any level. The bytes depend on timing, though: the same tree may pack differently.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from storage.archive.pipe import PipeSink

log = logging.getLogger(__name__)

MIN_LEVEL = 1
MAX_LEVEL = 6  # levels 7 and 8 took the peak RSS of an S3 upload over 150 MiB (P3)
START_LEVEL = 1  # a fast path is a short run: it cannot afford windows at too high a level
WINDOW_SECONDS = 0.5
STREAK = 2  # windows in a row that must agree before the level changes
# A compressor that waited less than this share of a window is the limit. Below it, waits are
# noise: thread switches and the GIL cost 5-15% of a window on a busy 2-core machine.
IDLE = 0.15
MARGIN = 0.25  # waits left over, as a share of the window, after a raise is paid for (> IDLE)
INCOMPRESSIBLE = 0.9  # a window stored at more than this share of its tar bytes
# CPU time of each level relative to the one below it: zstd with 2 threads on the tree of
# bench/artifacts.py (1: 2.58 s, 2: 3.56, 3: 6.51, 4: 10.2, 5: 12.6, 6: 16.3 CPU seconds).
_COST = {2: 1.38, 3: 1.83, 4: 1.57, 5: 1.23, 6: 1.29}
_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/stat counts in these


@dataclass(frozen=True)
class Window:
    """What one window saw: its length, how long the compressor waited for the pipe, the
    bytes it wrote per tar byte, the CPU seconds this process used and those the machine
    left idle (``None``: unknown)."""

    seconds: float
    waited: float
    stored_share: float
    cpu_used: float = 0.0
    cpu_idle: float | None = None


@dataclass(frozen=True)
class Control:
    """The level in use, and how many windows in a row have asked to raise it (> 0) or to
    lower it (< 0)."""

    level: int = START_LEVEL
    streak: int = 0


def next_control(control: Control, window: Window) -> Control:
    """The control after ``window``: a pure function of what was measured."""
    vote = _vote(control.level, window)
    same_way = control.streak != 0 and (vote > 0) == (control.streak > 0)
    streak = control.streak + vote if vote and same_way else vote
    if abs(streak) < STREAK:
        return Control(control.level, streak)
    return Control(min(MAX_LEVEL, max(MIN_LEVEL, control.level + vote)), 0)


def _vote(level: int, window: Window) -> int:
    """+1 to raise, -1 to lower, 0 to hold."""
    waited = window.waited / window.seconds if window.seconds > 0 else 0.0
    if waited < IDLE:
        return -1 if level > MIN_LEVEL else 0
    if level == MAX_LEVEL or waited < raise_threshold(level):
        return 0
    compresses = window.stored_share <= INCOMPRESSIBLE
    return 1 if compresses and _affordable(level + 1, window) else 0


def _affordable(level: int, window: Window) -> bool:
    """Whether the idle CPU would pay for ``level``: its extra cost over the level below, as
    if all this process's CPU were compression (it is not: an upper bound)."""
    if window.cpu_idle is None:
        return True
    return window.cpu_idle >= (_COST[level] - 1) * window.cpu_used


def raise_threshold(level: int) -> float:
    """The share of a window the compressor must have waited at ``level`` to pay for the
    next level: at ``cost`` times the work, its busy share ``1 - waited`` grows by ``cost``,
    and must still leave ``MARGIN``."""
    cost = _COST[level + 1]
    return 1 - (1 - MARGIN) / cost


def cpu_seconds() -> tuple[float, float | None]:
    """CPU seconds so far: this process's (all threads), and the machine's idle ones (from
    ``/proc/stat``: idle and iowait of all CPUs; ``None`` where it cannot be read)."""
    own = time.process_time()
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
        return own, (int(fields[4]) + int(fields[5])) / _TICKS
    except (OSError, ValueError, IndexError):
        return own, None


def _difference(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else now - before


class Frame(Protocol):
    """One zstd frame being written: ``close`` ends it (and leaves the sink open);
    ``progress`` is (tar bytes compressed, bytes produced) so far in it."""

    def write(self, data: Any) -> int: ...

    def close(self) -> None: ...

    def progress(self) -> tuple[int, int]: ...


class AdaptiveWriter:
    """A writable that compresses into ``sink`` as zstd frames, each opened by
    ``open_frame(level)``, the level chosen by ``next_control`` once a window (``clock`` and
    ``cpu`` measure time and CPU, as ``cpu_seconds`` does by default). ``close`` ends
    the last frame (``open_frame``'s writers must leave ``sink`` open). Each window is logged
    at DEBUG with ``extra`` fields ``archive_level`` (in use), ``next_level`` (chosen),
    ``tar_bytes``, ``elapsed``, ``compressor_waited`` and ``reader_waited`` (shares of the
    window), ``stored_share`` (bytes written per tar byte), ``cpu_used`` and ``cpu_idle``
    (CPUs: this process's, the machine's idle ones)."""

    def __init__(
        self,
        sink: PipeSink,
        open_frame: Callable[[int], Frame],
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], tuple[float, float | None]] | None = None,
    ) -> None:
        self._sink, self._open_frame, self._clock = sink, open_frame, clock
        self._cpu_seconds = cpu or cpu_seconds
        self._control = Control()
        self._frame = open_frame(self._control.level)
        self._tar_bytes, self._progress, self._share = 0, (0, 0), 1.0
        self._start = self._window_start = clock()
        self._waited = self._reader_waited = 0.0
        self._cpu = self._cpu_seconds()

    def write(self, data: Any) -> int:
        self._frame.write(data)
        self._tar_bytes += len(data)
        now = self._clock()
        if now - self._window_start >= WINDOW_SECONDS:
            self._end_window(now)
        return len(data)

    def close(self) -> None:
        self._frame.close()

    def _end_window(self, now: float) -> None:
        waits, cpu = self._sink.waits, self._cpu_seconds()
        waited, reader_waited = waits.writer.seconds(now), waits.reader.seconds(now)
        used, idle = cpu[0] - self._cpu[0], _difference(cpu[1], self._cpu[1])
        seconds = now - self._window_start
        window = Window(seconds, waited - self._waited, self._stored_share(), used, idle)
        control = next_control(self._control, window)
        self._log(window, reader_waited - self._reader_waited, now, control.level)
        if control.level != self._control.level:
            self._frame.close()  # ends this frame; the next one starts at the new level
            del self._frame  # frees its compressor first: never two in memory at once
            self._frame, self._progress = self._open_frame(control.level), (0, 0)
        self._control, self._window_start = control, now
        self._waited, self._reader_waited, self._cpu = waited, reader_waited, cpu

    def _stored_share(self) -> float:
        """Bytes produced per tar byte compressed since the last window (zstd's own count:
        its threads hold several MiB in flight, so bytes out of the pipe would lag); the
        last share if nothing was compressed since."""
        (consumed, produced), (consumed_before, produced_before) = (
            self._frame.progress(),
            self._progress,
        )
        if consumed > consumed_before:
            self._share = (produced - produced_before) / (consumed - consumed_before)
        self._progress = (consumed, produced)
        return self._share

    def _log(self, window: Window, reader_waited: float, now: float, chosen: int) -> None:
        shares: dict[str, float | None] = {
            "compressor_waited": window.waited / window.seconds,
            "reader_waited": reader_waited / window.seconds,
            "stored_share": window.stored_share,
            "cpu_used": window.cpu_used / window.seconds,
            "cpu_idle": None if window.cpu_idle is None else window.cpu_idle / window.seconds,
        }
        log.debug(
            "zstd level %d after %d tar bytes: the compressor waited %.0f%% of %.2f s",
            self._control.level,
            self._tar_bytes,
            100 * window.waited / window.seconds,
            window.seconds,
            extra={
                "archive_level": self._control.level,
                "next_level": chosen,
                "tar_bytes": self._tar_bytes,
                "elapsed": now - self._start,
                **shares,
            },
        )
