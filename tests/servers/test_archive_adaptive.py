"""ARCHIVE_LEVEL=auto: the level's decisions from measured waits, and artifacts whose level
changed mid-stream, read back by unpack, `zstd -d` and `tar --zstd`, also through real S3."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import zstandard

from storage import Store
from storage.archive import ArchiveOptions, adaptive, pack, unpack
from storage.archive.adaptive import (
    IDLE,
    INCOMPRESSIBLE,
    MAX_LEVEL,
    MIN_LEVEL,
    START_LEVEL,
    STREAK,
    AdaptiveWriter,
    Control,
    Window,
    next_control,
    raise_threshold,
)
from storage.artifacts import download_tree, upload_tree
from tests.support.archive_trees import build_tree, describe

MiB = 1 << 20


def windows(control: Control, waited: float, count: int, stored: float = 0.6) -> list[Control]:
    """The controls after ``count`` one-second windows in which the compressor waited
    ``waited`` seconds and wrote ``stored`` bytes per tar byte."""
    seen = []
    for _ in range(count):
        control = next_control(control, Window(1.0, waited, stored))
        seen.append(control)
    return seen


# --- the decisions --------------------------------------------------------------------------


def test_it_starts_at_the_fastest_level_and_stays_there_while_cpu_is_the_limit() -> None:
    assert Control().level == START_LEVEL == MIN_LEVEL == 1
    assert {c.level for c in windows(Control(), waited=0.0, count=20)} == {1}


def test_a_saturated_link_raises_the_level_only_after_a_streak_of_windows() -> None:
    seen = windows(Control(), waited=0.9, count=STREAK)
    assert [c.level for c in seen] == [1] * (STREAK - 1) + [2]


def test_one_contrary_window_restarts_the_streak() -> None:
    control = windows(Control(), waited=0.9, count=STREAK - 1)[-1]
    control = next_control(control, Window(1.0, 0.0, 0.6))  # the compressor did not wait once
    assert control == Control(1, 0)  # lowering is impossible at 1: the vote is to hold
    assert [c.level for c in windows(control, waited=0.9, count=STREAK)][-1] == 2


def test_the_level_climbs_one_step_per_streak_up_to_the_maximum() -> None:
    seen = windows(Control(), waited=0.99, count=STREAK * (MAX_LEVEL + 2))
    levels = [c.level for c in seen]
    assert levels[STREAK - 1 :: STREAK][: MAX_LEVEL - 1] == list(range(2, MAX_LEVEL + 1))
    assert levels[-1] == MAX_LEVEL


def test_a_compressor_that_never_waits_lowers_the_level_after_a_streak() -> None:
    seen = windows(Control(4, 0), waited=IDLE / 2, count=STREAK * 5)
    assert [c.level for c in seen][STREAK - 1 :: STREAK] == [3, 2, 1, 1, 1]


def test_data_that_does_not_compress_never_raises_the_level() -> None:
    assert {c.level for c in windows(Control(), waited=0.9, count=10, stored=1.0)} == {1}
    assert windows(Control(), waited=0.9, count=STREAK, stored=INCOMPRESSIBLE)[-1].level == 2


def test_a_saturated_link_raises_the_level_only_if_idle_cpu_pays_for_it() -> None:
    # Level 2 costs 1.38x level 1: 0.38 CPU seconds more per second this process used.
    def after(idle: float) -> int:
        control = Control()
        for _ in range(STREAK):
            control = next_control(control, Window(1.0, 0.9, 0.6, cpu_used=1.0, cpu_idle=idle))
        return control.level

    assert after(idle=0.0) == 1  # the uploader waits on CPU too: a higher level takes it
    assert after(idle=0.3) == 1
    assert after(idle=0.4) == 2


def test_waits_between_idle_and_the_raise_threshold_hold_the_level() -> None:
    for level in range(MIN_LEVEL, MAX_LEVEL):
        between = (IDLE + raise_threshold(level)) / 2
        assert {c.level for c in windows(Control(level, 0), between, 10)} == {level}


def test_a_dearer_next_level_needs_more_spare_time() -> None:
    # Level 3 costs ~1.8x level 2, level 2 ~1.4x level 1 (CPU measured on the bench tree).
    assert raise_threshold(2) > raise_threshold(1) > IDLE
    waited = (raise_threshold(1) + raise_threshold(2)) / 2
    assert windows(Control(1, 0), waited, STREAK)[-1].level == 2
    assert windows(Control(2, 0), waited, STREAK)[-1].level == 2


def test_against_a_link_it_settles_where_the_compressor_just_keeps_up() -> None:
    """A model: the compressor at level L makes ``speed[L]`` units a second, the link
    takes 100; the compressor waits for the share of the time it is ahead."""
    speed = {1: 400.0, 2: 290.0, 3: 160.0, 4: 100.0, 5: 80.0, 6: 60.0}
    control, levels = Control(), []
    for _ in range(60):
        waited = max(0.0, 1 - 100 / speed[control.level])
        control = next_control(control, Window(1.0, waited, 0.6))
        levels.append(control.level)
    assert set(levels[-30:]) == {3}  # 4 would keep up only without a margin; 3 has one


# --- frames ---------------------------------------------------------------------------------


class _Frames:
    """Stands in for zstd frames and the pipe's waits, to watch AdaptiveWriter's plumbing."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.closed = 0
        self.written: list[tuple[int, bytes]] = []
        self.waited = 0.0

    def open(self, level: int) -> Any:
        self.opened.append(level)
        frames = self

        class Frame:
            def write(self, data: Any) -> int:
                frames.written.append((level, bytes(data)))
                return len(data)

            def close(self) -> None:
                frames.closed += 1

            def progress(self) -> tuple[int, int]:
                tar = sum(len(data) for used, data in frames.written if used == level)
                return tar, tar // 2  # compresses 2x

        return Frame()

    def seconds(self, now: float) -> float:
        return self.waited


def test_a_level_change_ends_the_frame_and_opens_one_at_the_new_level() -> None:
    frames, now = _Frames(), [0.0]
    sink: Any = type("Sink", (), {})()
    sink.waits = type("Waits", (), {"writer": frames, "reader": frames})()
    writer = AdaptiveWriter(sink, frames.open, clock=lambda: now[0], cpu=lambda: (0.0, None))
    for index in range(STREAK + 1):
        now[0] += adaptive.WINDOW_SECONDS
        frames.waited += adaptive.WINDOW_SECONDS  # the compressor waited the whole window
        writer.write(b"%02d" % index)
    writer.close()

    assert frames.opened == [1, 2]
    assert frames.closed == 2  # the level-1 frame when the level changed, then the last one
    assert [level for level, _ in frames.written] == [1] * STREAK + [2]


# --- level changes mid-stream, read back ----------------------------------------------------


class Throttled:
    """Reads ``stream`` at ``rate`` bytes a second, 256 KiB at a time: a slow link."""

    def __init__(self, stream: BinaryIO, rate: float) -> None:
        self._stream, self._rate = stream, rate

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(min(size, 256 << 10) if size > 0 else 256 << 10)
        time.sleep(len(data) / self._rate)
        return data

    def readall(self) -> bytes:
        return b"".join(iter(lambda: self.read(256 << 10), b""))


@pytest.fixture
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 20 ms, and idle CPU not measured (on a busy machine there may be none):
    a few seconds of a slow reader see several level changes."""
    monkeypatch.setattr(adaptive, "WINDOW_SECONDS", 0.02)
    monkeypatch.setattr(adaptive, "cpu_seconds", lambda: (time.process_time(), None))


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[tuple[int, int]]]]:
    """The windows the adaptive writer logged so far: (level used, level chosen next)."""
    with caplog.at_level(logging.DEBUG, logger="storage.archive.adaptive"):
        yield lambda: [
            (r.archive_level, r.next_level) for r in caplog.records if hasattr(r, "next_level")
        ]


def changes(windows: list[tuple[int, int]]) -> int:
    return sum(1 for used, chosen in windows if chosen != used)


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    """The archive tests' tree, plus 20 MiB of 16 random symbols, which compress to about half
    (no level does better: this is about the pipeline, not the ratio): more than one S3 part."""
    tree = build_tree(tmp_path / "tree")
    symbols = bytes(i % 16 * 7 for i in range(256))
    (tree / "symbols.bin").write_bytes(os.urandom(20 * MiB).translate(symbols))
    return tree


def zstd_frames(data: bytes) -> int:
    count = 0
    while data:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        decompressor.decompress(data)
        data, count = decompressor.unused_data, count + 1
    return count


def plain_tar(tree: Path) -> bytes:
    with pack(tree, ArchiveOptions(format="none")) as stream:
        return stream.read()


@pytest.mark.usefixtures("short_windows")
def test_a_stream_whose_level_changed_unpacks_and_is_plain_zstd(
    big_tree: Path, tmp_path: Path, logged: Callable[[], list[tuple[int, int]]]
) -> None:
    with pack(big_tree, ArchiveOptions(level="auto")) as stream:
        data = Throttled(stream, rate=8 * MiB).readall()

    assert changes(logged()) >= 1, logged()
    assert zstd_frames(data) == changes(logged()) + 1  # a frame per change, and the first
    stats = unpack(io.BytesIO(data), tmp_path / "ours", format="zstd")
    assert describe(tmp_path / "ours") == describe(big_tree)
    assert (stats.size, stats.digest) == (len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    (tmp_path / "archive.tar.zst").write_bytes(data)
    decoded = subprocess.run(
        ["zstd", "-d", "-c", str(tmp_path / "archive.tar.zst")], capture_output=True, check=True
    ).stdout
    assert decoded == plain_tar(big_tree)  # the same tar as uncompressed: nothing lost between
    (tmp_path / "gnu").mkdir()
    subprocess.run(
        ["tar", "--zstd", "-xf", str(tmp_path / "archive.tar.zst"), "-C", str(tmp_path / "gnu")],
        check=True,
    )
    assert describe(tmp_path / "gnu") == describe(big_tree)


@pytest.mark.server
@pytest.mark.usefixtures("short_windows")
@pytest.mark.parametrize("backend", ["s3"])
def test_an_artifact_whose_level_changed_survives_real_s3(
    store: Store, big_tree: Path, tmp_path: Path, logged: Callable[[], list[tuple[int, int]]]
) -> None:
    key = "artifacts/auto.tar.zst"
    info = upload_tree(
        store,
        key,
        big_tree,
        ArchiveOptions(level="auto"),
        wrap=lambda stream: Throttled(stream, rate=8 * MiB),  # type: ignore[arg-type,return-value]
    )
    with store.open(key) as stored:
        data = stored.read()
    stats = download_tree(store, key, tmp_path / "ours", expected_digest=info.digest)

    assert changes(logged()) >= 1, logged()
    assert zstd_frames(data) == changes(logged()) + 1
    assert info.size > 8 * MiB  # more than one part: a multipart upload
    assert (info.size, info.digest) == (len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    assert (stats.size, stats.digest) == (info.size, info.digest)
    assert describe(tmp_path / "ours") == describe(big_tree)
    decoded = subprocess.run(["zstd", "-d", "-c"], input=data, capture_output=True, check=True)
    assert decoded.stdout == plain_tar(big_tree)
