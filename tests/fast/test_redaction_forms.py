"""Each covered form of a secret is redacted from a log line, and only the secret: the
forms are made here with the standard library (or written out by hand), not with the code
under test. The value holds each character that encoders treat specially."""

from __future__ import annotations

import base64
import json
import re
import shlex
import unicodedata
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest

from functions.protocol import go_json
from functions.redaction import REDACTED, Redactor

# '"', '\', "'", '@', '/', '+', '=', non-ASCII (é as one code point, CJK, an astral
# character), a tab and a newline.
VALUE = "pa\"ss\\w'o@r/d+x=é日本𝄞\tend\nline-two"
MARK = "MARKER"  # stands for the value where an encoder treats every character alone


def redacted(text: str, value: str = VALUE) -> str:
    return Redactor([value]).redact_text(text)


def upper_hex(text: str) -> str:
    return re.sub(r"\\u[0-9a-f]{4}", lambda m: "\\u" + m.group()[2:].upper(), text)


def lower_percent(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), text)


def around(show: Callable[[str], str]) -> tuple[str, str]:
    """The value shown by ``show``, and the same text with the value's part redacted."""
    return show(VALUE), show(MARK).replace(MARK, REDACTED)


CHARWISE = {
    "raw": lambda v: f"password={v} end",
    "json ensure_ascii": lambda v: json.dumps({"password": v}),
    "json utf-8": lambda v: json.dumps({"password": v}, ensure_ascii=False),
    "json upper-case \\u": lambda v: upper_hex(json.dumps({"password": v})),
    "json with \\/ (PHP)": lambda v: json.dumps({"password": v}).replace("/", "\\/"),
    "json utf-8 with \\/": lambda v: json.dumps([v], ensure_ascii=False).replace("/", "\\/"),
    "json twice": lambda v: json.dumps({"body": json.dumps({"password": v})}),
    "json twice, utf-8 inside": lambda v: json.dumps(json.dumps([v], ensure_ascii=False)),
    "json three times": lambda v: json.dumps([json.dumps([json.dumps({"p": v})])]),
    "json three times utf-8": lambda v: json.dumps(
        json.dumps(json.dumps(v, ensure_ascii=False), ensure_ascii=False), ensure_ascii=False
    ),
    "go (a script echoing its stdin)": lambda v: go_json({"source": {"password": v}}).decode(),
    "go twice": lambda v: go_json(go_json({"p": v}).decode()).decode(),
    "percent-encoded": lambda v: "https://ci:" + quote(v, safe="") + "@git.example.com/r",
    "percent-encoded, / safe": lambda v: "path=" + quote(v),
    "percent-encoded, lower-case hex": lambda v: "q=" + lower_percent(quote(v, safe="")),
    "form-encoded": lambda v: "user=ci&password=" + quote_plus(v),
    "form-encoded, lower-case hex": lambda v: "password=" + lower_percent(quote_plus(v)),
    "encodeURIComponent": lambda v: "u=" + quote(v, safe="!'()*"),
    "shell, bash set -x": lambda v: "+ curl -u 'ci:" + v.replace("'", "'\\''") + "'",
    "python repr": lambda v: repr({"password": v}),
    "python ascii": lambda v: ascii({"password": v}),
    "python repr of bytes": lambda v: repr(v.encode()),
}


@pytest.mark.parametrize("show", CHARWISE.values(), ids=CHARWISE.keys())
def test_each_form_is_redacted_and_only_the_value(show: Callable[[str], str]) -> None:
    text, expected = around(show)
    assert redacted(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("+ git clone --password " + shlex.quote(VALUE), "+ git clone --password '[redacted]'"),
        ("key=" + VALUE.encode().hex(), "key=[redacted]"),
        ("KEY=" + VALUE.encode().hex().upper() + ";", "KEY=[redacted];"),
    ],
    ids=["shlex.quote", "hex", "HEX"],
)
def test_forms_that_change_every_character(text: str, expected: str) -> None:
    assert redacted(text) == expected


def test_python_repr_in_double_quotes() -> None:
    value = "it's-a-s3cret/é\t\x00"  # no '"': repr quotes it with '"', leaving "'" alone
    assert repr(value).startswith('"')
    assert redacted(f"value={value!r}", value) == 'value="[redacted]"'


def test_dotnet_json_escapes_are_redacted() -> None:
    # System.Text.Json's default encoder, as it writes "p4ss+w<o>rd'é&`\"x"
    written = "p4ss\\u002Bw\\u003Co\\u003Erd\\u0027\\u00E9\\u0026\\u0060\\u0022x"
    assert redacted(f'{{"password":"{written}"}}', "p4ss+w<o>rd'é&`\"x") == (
        '{"password":"[redacted]"}'
    )


def test_unicode_nfd_of_an_nfc_value_and_nfc_of_an_nfd_value() -> None:
    nfc = unicodedata.normalize("NFC", "pässwörd-Ångström")
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    assert redacted(f"pw {nfd} !", nfc) == "pw [redacted] !"
    assert redacted(f"pw {nfc} !", nfd) == "pw [redacted] !"
    assert redacted(json.dumps(nfd), nfc) == '"[redacted]"'


def b64_core(
    prefix: bytes, suffix: bytes, encode: Callable[[bytes], bytes]
) -> tuple[str, int, int]:
    """A base64 text holding the value between ``prefix`` and ``suffix``, and where the
    characters that only the value's bytes decide begin and end: found by flipping every bit
    of the neighbours (a character holding any of their bits, or padding, changes)."""
    data = VALUE.encode()
    text = encode(prefix + data + suffix).decode()
    flipped = encode(bytes(b ^ 0xFF for b in prefix) + data + bytes(b ^ 0xFF for b in suffix))
    fixed = [a == b and a != "=" for a, b in zip(text, flipped.decode(), strict=True)]
    first, last = fixed.index(True), len(fixed) - fixed[::-1].index(True)
    assert all(fixed[first:last])
    return text, first, last


def assert_core_redacted(shown: str, text: str, first: int, last: int) -> None:
    """``shown`` is ``text`` with all of ``text[first:last]`` in one ``[redacted]``, which
    may take one more character each side (a neighbour's bits that happen to match)."""
    lead, token, trail = shown.partition(REDACTED)
    assert token and REDACTED not in trail
    assert text.startswith(lead) and first - 1 <= len(lead) <= first
    assert text.endswith(trail) and len(text) - last - 1 <= len(trail) <= len(text) - last


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
@pytest.mark.parametrize("before", [b"", b"u", b"us", b"ci:", b"user:"])
@pytest.mark.parametrize("after", [b"", b"!", b"!!", b"\xff\xff\xff"])
def test_base64_at_each_alignment(
    encode: Callable[[bytes], bytes], before: bytes, after: bytes
) -> None:
    text, first, last = b64_core(before, after, encode)
    assert_core_redacted(redacted(text), text, first, last)


def test_an_http_basic_header_as_curl_prints_it() -> None:
    header = "Authorization: Basic " + base64.b64encode(f"ci-bot:{VALUE}".encode()).decode()
    shown = redacted(f"> GET /repo.git/info/refs HTTP/1.1\r\n> {header}\r\n")
    assert shown.startswith("> GET /repo.git/info/refs HTTP/1.1\r\n> Authorization: Basic ")
    core = header.rsplit(" ", 1)[1][8:-8]  # the middle of the encoded value
    assert core not in shown and REDACTED in shown


@pytest.mark.parametrize("at", [1, 4, 9, 17, 25, len(VALUE) - 1])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_value_folded_across_two_lines(at: int, newline: str) -> None:
    folded = VALUE[:at] + newline + VALUE[at:]
    assert redacted(f"token: {folded} (end)\n") == f"token: {REDACTED} (end)\n"


def test_base64_wrapped_at_76_columns_as_mime_does() -> None:
    value = "correct-horse-battery-staple-" * 4  # long enough to cross a line
    wrapped = base64.encodebytes(b"user:" + value.encode()).decode()
    assert wrapped.count("\n") > 1
    shown = redacted(wrapped, value)
    assert shown.startswith("dXNlcjp") and REDACTED in shown
    core = base64.b64encode(value.encode()).decode()[8:-8]
    assert core not in shown.replace("\n", "")


def test_line_breaks_count_as_a_fold_up_to_two_bytes_per_character() -> None:
    assert redacted("pass" + "\r\n" * 8 + "word", "password") == REDACTED
    assert redacted("pass" + "\n" * 17 + "word", "password") == "pass" + "\n" * 17 + "word"
