"""Text a resource wrote, made safe for an operator's terminal (pure). A resource controls its
log and its versions; printed as-is, a control character is an instruction to the terminal: an
escape sequence may write the clipboard (OSC 52), change the title, move the cursor, or a
carriage return overwrite what the line said. Every control character but newline and tab, and
every bidirectional override, prints as a visible escape (``\\x1b``, ``\\u202e``); bytes that
are not UTF-8 as ``\\xNN``."""

from __future__ import annotations

import codecs
import unicodedata
from collections.abc import Iterator
from typing import BinaryIO

KEPT = "\n\t"
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(char: str) -> str:
    if char in KEPT or (unicodedata.category(char) != "Cc" and char not in BIDI):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with its control characters as visible escapes."""
    return "".join(_shown(c) for c in text)


def escaped_chunks(stream: BinaryIO, size: int = 1 << 16) -> Iterator[str]:
    """The bytes of ``stream`` as escaped text, chunk by chunk (a character split across
    chunks decodes whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
    while chunk := stream.read(size):
        yield escape(decoder.decode(chunk))
    yield escape(decoder.decode(b"", final=True))
