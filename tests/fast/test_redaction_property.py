"""Property: any secret of 4 to 64 characters from a wide alphabet, in each covered form, at
any position of a log, never survives redaction, and the log around it survives intact;
also when the log arrives in any chunks and is cut to its tail anywhere (in a container's
output, as the container runtime keeps it, or in a file, as the task pod's collect reads
it). The forms are made here with the standard library, not with the code under test."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import unicodedata
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, quote_plus

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.protocol import go_json
from functions.redaction import REDACTED, Redactor
from functions.runtimes.output import STDERR, Output
from functions.task import untrusted_files

TOKEN = REDACTED.encode()
FILLER = "~\r\n"  # the log around the secret; "~" is kept out of secrets, so no form holds it
MARK = "MARK"
BREAKS = "\r\n"

# Forms: (lead, core, trail) of the text a script would print; only the core is secret.
Form = tuple[str, str, str]


def wrapped(encode: Callable[[str], str]) -> Callable[[str], Form]:
    """An encoder that treats each character alone: what it puts around the value is found
    by encoding a plain marker."""

    def form(secret: str) -> Form:
        lead, trail = encode(MARK).split(MARK)
        text = encode(secret)
        assert text.startswith(lead) and text.endswith(trail)
        return lead, text[len(lead) : len(text) - len(trail)], trail

    return form


def quoted(text: str, lead: int, trail: int = 1) -> Form:
    return text[:lead], text[lead:-trail], text[-trail:]


def shell(secret: str) -> Form:
    text = shlex.quote(secret)
    return ("", text, "") if text == secret else quoted(text, 1)


FORMS: dict[str, Callable[[str], Form]] = {
    "raw": lambda s: ("", s, ""),
    "NFC": lambda s: ("", unicodedata.normalize("NFC", s), ""),
    "NFD": lambda s: ("", unicodedata.normalize("NFD", s), ""),
    "json": wrapped(json.dumps),
    "json utf-8": wrapped(lambda s: json.dumps(s, ensure_ascii=False)),
    "json twice": wrapped(lambda s: json.dumps({"body": json.dumps({"password": s})})),
    "json twice utf-8": wrapped(lambda s: json.dumps(json.dumps(s, ensure_ascii=False))),
    "json three times": wrapped(lambda s: json.dumps(json.dumps(json.dumps([s])))),
    "json \\/": wrapped(lambda s: json.dumps(s).replace("/", "\\/")),
    "go json": wrapped(lambda s: go_json({"source": {"password": s}}).decode()),
    "quote": lambda s: ("", quote(s, safe=""), ""),
    "quote /": lambda s: ("", quote(s), ""),
    "quote_plus": lambda s: ("", quote_plus(s), ""),
    "quote lower hex": lambda s: ("", re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(s)), ""),
    "shlex.quote": shell,
    "bash set -x": lambda s: ("'", s.replace("'", "'\\''"), "'"),
    "repr": lambda s: quoted(repr(s), 1),
    "ascii": lambda s: quoted(ascii(s), 1),
    "repr of bytes": lambda s: quoted(repr(s.encode()), 2),
    "hex": lambda s: ("", s.encode().hex(), ""),
    "HEX": lambda s: ("", s.encode().hex().upper(), ""),
}

secrets = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="~"), min_size=4, max_size=64
).filter(
    lambda s: len(s.strip(BREAKS)) == len(s) and len(s.replace("\r", "").replace("\n", "")) >= 4
)
filler = st.text(st.sampled_from(FILLER), max_size=40)


Leak = tuple[str, bytes, bytes, bytes, bytes, bytes]


@st.composite
def leaks(draw: st.DrawFn) -> Leak:
    """A secret and a log showing it in one form: (secret, prefix, lead, core, trail,
    suffix), the log being their concatenation."""
    secret = draw(secrets)
    kind = draw(st.sampled_from([*FORMS, "base64", "folded"]))
    if kind == "base64":
        lead, core, trail = draw(base64_form(secret))
    elif kind == "folded":
        at = draw(st.integers(1, len(secret) - 1))
        lead, core, trail = (
            "",
            secret[:at] + draw(st.sampled_from(["\n", "\r\n"])) + secret[at:],
            "",
        )
    else:
        lead, core, trail = FORMS[kind](secret)
    prefix, suffix = draw(filler), draw(filler)
    return secret, *(part.encode() for part in (prefix, lead, core, trail, suffix))  # type: ignore[return-value]


@st.composite
def base64_form(draw: st.DrawFn, secret: str) -> Form:
    """The secret inside base64 of random neighbours: the characters that any bit of the
    neighbours (or padding) can change are lead and trail."""
    before, after = draw(st.binary(max_size=5)), draw(st.binary(max_size=5))
    encode = draw(st.sampled_from([base64.b64encode, base64.urlsafe_b64encode]))
    data = secret.encode()
    text = encode(before + data + after).decode()
    flipped = encode(bytes(b ^ 0xFF for b in before) + data + bytes(b ^ 0xFF for b in after))
    fixed = [a == b and a != "=" for a, b in zip(text, flipped.decode(), strict=True)]
    first, last = fixed.index(True), len(fixed) - fixed[::-1].index(True)
    return text[:first], text[first:last], text[last:]


def covered_span(leak: Leak) -> tuple[bytes, int, int]:
    """The log, and the one range of it that redaction covers, checked: all of the core,
    nothing of the log around it (the lead and trail an encoder put around the value may go
    with it, in part or whole: they are not secret, but they may look like it)."""
    secret, prefix, lead, _core, trail, suffix = leak
    log = b"".join(leak[1:])  # type: ignore[arg-type]
    shown = Redactor([secret]).redact(log)
    assert shown.count(TOKEN) == 1, (log, shown)
    head, _, tail = shown.partition(TOKEN)
    assert (prefix + lead).startswith(head) and len(head) >= len(prefix), (log, shown)
    assert (trail + suffix).endswith(tail) and len(tail) >= len(suffix), (log, shown)
    return log, len(head), len(log) - len(tail)


@settings(max_examples=500, deadline=None)
@given(leaks())
def test_no_covered_form_survives_and_the_log_around_it_does(leak: Leak) -> None:
    covered_span(leak)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(leaks(), st.data())
def test_a_tail_cut_anywhere_of_a_log_read_in_any_chunks_keeps_no_part_of_it(
    tmp_path: Path, leak: Leak, data: st.DataObject
) -> None:
    log, begin, end = covered_span(leak)
    limit = data.draw(st.integers(1, len(log)), label="limit")
    redactor = Redactor([leak[0]])
    keep = limit + redactor.window
    if data.draw(st.booleans(), label="from a file"):
        (tmp_path / "stderr").write_bytes(log)
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            window = untrusted_files.read_tail(fd, "stderr", keep) or b""
        finally:
            os.close(fd)
    else:
        output, position = Output(keep), 0
        sizes = data.draw(st.lists(st.integers(1, 64), max_size=20), label="chunks")
        for size in [*sizes, len(log)]:
            output.add(STDERR, log[position : position + size])
            position += size
        window = output.stderr
    cut = len(log) - limit
    if cut <= begin:
        expected = log[cut:begin] + TOKEN + log[end:]
    elif cut < end:
        expected = TOKEN + log[end:]
    else:
        expected = log[cut:]
    assert redactor.tail(window, limit) == expected
