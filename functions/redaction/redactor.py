"""THE redactor: every form of every secret out of a text, at a cost linear in the text.

One Aho-Corasick automaton (``ahocorasick_rs``) is built per run over an anchor, a few bytes
from a rare byte on and one secret's only, of every form (``forms``) of every redactable
value (``policy``); a match is then compared with the whole forms anchored there. The text
is searched with its line breaks (CR, LF) taken out, and the patterns too, so a form folded
across lines (base64 wrapped at 76 columns, a terminal's wrap) is found like a whole one; a
match counts if its breaks add at most two bytes per character of the form (``span``).
Matches may overlap (one secret inside or across another): the union of them all is
redacted, each maximal run of covered bytes replaced by one ``[redacted]``.

A cut never leaves part of a secret: ``tail(data, limit)`` redacts the last ``limit`` bytes
of ``data`` with what comes before them as context, and an occurrence that reaches into
those bytes spans at most ``window`` bytes, so a caller that keeps ``limit + window`` bytes of
a stream (a file's tail, a container's stderr) holds every such occurrence whole.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate

import ahocorasick_rs

from functions.redaction.forms import forms
from functions.redaction.policy import redactable

REDACTED = "[redacted]"
_TOKEN = REDACTED.encode()
MIN_FORM_BYTES = 4
# The automaton holds an anchor of each form, ANCHOR_BYTES of it (fewer states: a smaller
# automaton is a faster one, built sooner); a match is a candidate, compared with the whole
# form. Six bytes make candidates rare even in hex (16^6 values) where no secret is.
ANCHOR_BYTES = 6
# Bytes from the most common in build logs to the rarest, by class: English text in lower
# case, digits, bytes of UTF-8 characters past ASCII (common in a log of another language,
# and a secret that holds them has rarer ASCII bytes more often than not), everyday
# punctuation and what starts an escape (``\`` of JSON and ``repr``, ``%``: a form's escapes
# are in every log that escapes), upper case, other punctuation; control bytes rarest. A
# form's anchor is the window that starts with its rarest byte: the automaton leaves its
# start state only where a text holds an anchor's first byte, so with thousands of forms
# whose anchors would start anywhere it takes a step deeper at nearly every byte, which made
# a search for 3,200 secrets cost 2.7-3.2x one for a single secret (bench/README.md, R2).
_COMMON_FIRST = (
    b" \t"
    b"etaoinsrhldcumfpgwybvkxjqz"
    b"0123456789" + bytes(range(0x80, 0x100)) + b"./-_:=,()'\"%\\"
    b"ETAOINSRHLDCUMFPGWYBVKXJQZ"
    b"[]{}<>;?+*&#$@!|^~`"
)
_RARITY = bytes(
    _COMMON_FIRST.index(b) if b in _COMMON_FIRST else len(_COMMON_FIRST) for b in range(256)
)
# An anchor stands for the forms of one secret: the first secret to take a window keeps it,
# and another secret's forms take their next rarest window. A window that forms of different
# secrets share was written by an encoder (``\u0026``, ``%2F``) or is a prefix many secrets
# have (the base64 of ``ghp_``), and is common in logs for the same reason; each match of an
# anchor is compared with each of its forms, so one such window, left shared, cost thousands
# of compares at each of its matches. Forms of one secret share windows freely (its raw and
# escaped forms hold the same letters): those match only where the secret's own bytes are.
_BLOCK = 1 << 18  # searched at a time: bounds the list of matches of a pathological text


def anchor_at(pattern: bytes, secret: int, owners: dict[bytes, int]) -> int:
    """Where the anchor of a form of ``secret`` (a number) starts: at its rarest byte that an
    anchor can start at (the first of them), unless that window is one byte repeated or
    ``owners`` (the secret of each anchor chosen so far) gives it to another secret; then at
    the next rarest, and so on; if no window is left, at the rarest that is not one byte
    repeated, shared."""
    rarity = pattern[: max(1, len(pattern) - ANCHOR_BYTES + 1)].translate(_RARITY)
    at = rarity.index(max(rarity))
    window = pattern[at : at + ANCHOR_BYTES]
    if owners.get(window, secret) == secret and not _repeated(window):
        return at  # nearly always: the rest is for the windows encoders write

    levels = sorted(set(rarity), reverse=True)
    for level in levels:  # rarest first; at a level, the first first
        start = rarity.find(level)
        while start != -1:
            window = pattern[start : start + ANCHOR_BYTES]
            if owners.get(window, secret) == secret and not _repeated(window):
                return start
            start = rarity.find(level, start + 1)
    for level in levels:
        start = rarity.find(level)
        while start != -1:
            if not _repeated(pattern[start : start + ANCHOR_BYTES]):
                return start
            start = rarity.find(level, start + 1)
    return at


def _repeated(window: bytes) -> bool:
    """One byte over and over (``\\\\\\``, ``======``): in escaped or padded text, such a
    window matches at every byte of a run."""
    return len(window) > 1 and not window.strip(window[:1])


class Redactor:
    """Built once per run from its secret values (``policy.secret_values``)."""

    def __init__(self, values: Iterable[str]) -> None:
        spans: dict[bytes, int] = {}
        secret_of: dict[bytes, int] = {}  # the first secret (a number) of each form
        for secret, value in enumerate(redactable(values)):
            for form in forms(value):
                flat = _flat(form)
                if len(flat) >= MIN_FORM_BYTES:
                    spans[flat] = max(spans.get(flat, 0), span(form, flat))
                    secret_of.setdefault(flat, secret)
        self._patterns = list(spans)
        self._spans = list(spans.values())
        anchors: dict[bytes, list[tuple[int, int]]] = {}
        owners: dict[bytes, int] = {}  # the secret of each anchor (the first to take it)
        for index, pattern in enumerate(self._patterns):
            at = anchor_at(pattern, secret_of[pattern], owners)
            window = pattern[at : at + ANCHOR_BYTES]
            anchors.setdefault(window, []).append((index, at))
            owners.setdefault(window, secret_of[pattern])
        self._anchors = list(anchors)
        self._anchored = list(anchors.values())  # each anchor's forms, and where it starts in them
        # The most bytes an occurrence can cover in a text: keep this much before a cut.
        self.window = max(self._spans, default=0)

    def __bool__(self) -> bool:
        return bool(self._patterns)

    @functools.cached_property
    def _automaton(self) -> ahocorasick_rs.BytesAhoCorasick:
        # One implementation whatever the number of secrets: a DFA scans small sets faster
        # but its build time and memory grow fast with them.
        return ahocorasick_rs.BytesAhoCorasick(
            self._anchors, implementation=ahocorasick_rs.Implementation.ContiguousNFA
        )

    def tail(self, data: bytes, limit: int) -> bytes:
        """The last ``limit`` bytes of ``data``, redacted; the bytes before them are context
        (give ``window`` of them, or all there are)."""
        start = max(0, len(data) - limit)
        pieces, done = [], start
        for begin, end in self.covered(data):
            if end > done:
                pieces += [data[done : max(begin, done)], _TOKEN]
                done = end
        pieces.append(data[done:])
        return b"".join(pieces)

    def redact(self, data: bytes) -> bytes:
        return self.tail(data, len(data))

    def redact_text(self, text: str) -> str:
        if not self._patterns or not text:
            return text
        data = text.encode("utf-8", "surrogatepass")
        return self.redact(data).decode("utf-8", "surrogatepass")

    def finds(self, text: str) -> bool:
        """Whether ``text`` holds a form of a secret."""
        return bool(self._patterns) and bool(self.covered(text.encode("utf-8", "surrogatepass")))

    def covered(self, data: bytes) -> list[tuple[int, int]]:
        """The byte ranges of ``data`` that secrets cover: merged, in order."""
        if not self._patterns or not data:
            return []
        flat, offsets = _flatten(data)
        found: list[tuple[int, int]] = []
        view = memoryview(flat)
        for block in range(0, len(flat), _BLOCK):  # blocks overlap: an anchor may cross one
            base = max(0, block - ANCHOR_BYTES + 1)
            matches = self._automaton.find_matches_as_indexes(
                view[base : block + _BLOCK], overlapping=True
            )
            found += _merged(self._spans_in(flat, matches, base, block, offsets))
        return _merged(found)

    def _spans_in(
        self,
        flat: bytes,
        matches: list[tuple[int, int, int]],
        base: int,
        block: int,
        offsets: _Offsets | None,
    ) -> list[tuple[int, int]]:
        """The ranges of the text that the forms whose anchors a block matched cover (the
        block starts at flat position ``base``; anchors ending before ``block`` belong to
        the block before)."""
        spans = []
        for anchor, begin, end in matches:
            if base + end <= block:
                continue
            for index, at in self._anchored[anchor]:
                start = base + begin - at
                if start < 0 or not flat.startswith(self._patterns[index], start):
                    continue
                stop = start + len(self._patterns[index])
                if offsets is not None:
                    start, stop = offsets.original(start), offsets.original(stop - 1) + 1
                    if stop - start > self._spans[index]:
                        continue  # too many line breaks in it to be a folded form
                spans.append((start, stop))
        return spans


def span(form: bytes, flat: bytes) -> int:
    """The most bytes a form may cover in a text: its own, plus a line break of up to two
    bytes (CRLF) per character."""
    return len(form) + 2 * len(flat)


def _flat(data: bytes) -> bytes:
    return data.replace(b"\r", b"").replace(b"\n", b"")


def _flatten(data: bytes) -> tuple[bytes, _Offsets | None]:
    """``data`` without its line breaks, and the way back (None: it had none)."""
    if b"\n" not in data and b"\r" not in data:
        return data, None
    size = _Offsets.BLOCK
    pieces = [_flat(data[start : start + size]) for start in range(0, len(data), size)]
    return b"".join(pieces), _Offsets(data, list(accumulate(map(len, pieces), initial=0)))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((begin, end))
    return merged


class _Offsets:
    """Positions in a text without its line breaks mapped back to the text, by blocks of
    ``BLOCK`` bytes. The breaks of a block are listed only when a match falls in it: most
    of a log is never looked at."""

    BLOCK = 1 << 14

    def __init__(self, data: bytes, starts: list[int]) -> None:
        self._data = data
        self._starts = starts  # for each block, the flat position of its first byte
        self._breaks: dict[int, list[int]] = {}

    def original(self, flat: int) -> int:
        """Where the byte at ``flat`` (not a line break) is in the text."""
        block = bisect_right(self._starts, flat) - 1
        local = flat - self._starts[block]
        return block * self.BLOCK + local + bisect_right(self._block_breaks(block), local)

    def _block_breaks(self, block: int) -> list[int]:
        """For each line break of the block, how many other bytes of the block precede it."""
        if block not in self._breaks:
            start = block * self.BLOCK
            chunk = self._data[start : start + self.BLOCK].replace(b"\r", b"\n")
            self._breaks[block] = list(accumulate(map(len, chunk.split(b"\n"))))[:-1]
        return self._breaks[block]
