"""What a resource wrote reaches an operator's terminal escaped: ``logs`` and ``versions``
print control characters (terminal sequences such as OSC 52 clipboard writes and title
changes, carriage returns that overwrite a line, bidirectional overrides) as visible escapes;
newlines and tabs stay. ``logs --raw`` writes the stored bytes as they are."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from functions import keys
from functions.cli.commands import main
from functions.cli.inspect import format_runs, format_versions
from functions.ledger import history, results, run_index

CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"  # OSC 52: set the clipboard
TITLE = "\x1b]0;owned\x1b\\"  # OSC 0 with an ST terminator: set the window title
HIDE = "secret\rok    "  # a carriage return overwrites what came before
BIDI = "a\u202eb"  # right-to-left override
RUN = "a" * 32


def hostile(text: str) -> bool:
    return any(c in text for c in "\x1b\x07\r\u202e\x9b")


def test_versions_print_control_characters_escaped() -> None:
    known = history.History(versions=({"ref": CLIPBOARD, "title": TITLE + BIDI},), checked_at=1.0)

    shown = format_versions(known, "r" * 64)

    assert not hostile(shown)
    assert "\\x1b]52;c;" in shown and "\\x07" in shown and "\\u202e" in shown


def test_runs_print_control_characters_escaped() -> None:
    row = run_index.RunRow(
        run_id=RUN,
        action="check",
        type_name=None,
        image="x",
        started_at=0.0,
        outcome="failed",
        kind="script\x1b[2J",
        seconds=None,
    )
    assert not hostile(format_runs([row]))


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "store").mkdir()
    monkeypatch.setenv("STORE_URL", (tmp_path / "store").as_uri())
    from storage import open_store

    log = f"cloning\n\tstep {CLIPBOARD}{TITLE}\n{HIDE}\n€ \x9b2J done\n".encode()
    # a multi-byte character split across the reader's chunks decodes whole
    results.write_once(open_store((tmp_path / "store").as_uri()), keys.log_key(RUN), log)
    return tmp_path


def test_logs_print_control_characters_escaped(
    store_env: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["logs", RUN]) == 0

    shown = capsysbinary.readouterr().out.decode()
    assert not hostile(shown)
    assert shown.startswith("cloning\n\tstep \\x1b]52;c;")
    assert "secret\\x0dok" in shown and "€ \\x9b2J done\n" in shown


def test_logs_raw_writes_the_stored_bytes(
    store_env: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["logs", "--raw", RUN]) == 0

    assert CLIPBOARD.encode() in capsysbinary.readouterr().out


def test_escaping_a_stream_keeps_characters_split_across_chunks() -> None:
    from functions.cli.terminal_text import escaped_chunks

    text = "€\x1b".encode()
    chunks = [text[:1], text[1:2], text[2:]]
    assert "".join(escaped_chunks(io.BytesIO(b"".join(chunks)), size=1)) == "€\\x1b"
