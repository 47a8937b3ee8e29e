"""The forms in which a secret value can reappear in what a script prints (pure).

``forms(value)`` gives the bytes of each, generated from the value: as the encoders that
scripts, libraries and tools commonly apply write it. What is covered, and why this way
(docs/redaction.md):

- the value raw, its Unicode NFC and NFD (each of the forms below is made of all three);
- JSON string escapes once, twice and three times (a JSON document quoted inside another):
  every chain of Python's two encoders (``ensure_ascii`` on and off), and the same encoder
  applied at each level for PHP (``\\/``, with and without ``\\u`` escapes), upper-case
  ``\\uXXXX``, Go (HTML-safe ``<>&``) and .NET (HTML-safe ``<>&'+"`` and non-ASCII, upper case);
- percent-encoding: ``quote`` with no safe character and with ``/``, ``quote_plus``,
  ``encodeURIComponent``'s set, each with upper- and lower-case hex;
- base64, standard and URL-safe, at each of the three alignments: the characters that depend
  on the value's bytes alone, so the value is found inside any encoded text (``user:password``
  in an HTTP Basic header included);
- shell single quotes (``'\\''`` and ``'"'"'``), Python ``repr`` and ``ascii`` of the text
  (either quote) and ``repr`` of its UTF-8 bytes;
- hex of the UTF-8 bytes, lower and upper case.

Line breaks inside a form (a folded value) are handled by the redactor, not here.
"""

from __future__ import annotations

import base64
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from urllib.parse import quote, quote_plus

Encoder = Callable[[str], str]

# What encodeURIComponent leaves alone besides what quote always does (letters, digits, _.-~).
_URI_COMPONENT_SAFE = "!'()*"
_HEX_ESCAPE = re.compile(r"\\u[0-9a-f]{4}")
_PERCENT = re.compile(r"%[0-9A-F]{2}")
# Characters that no encoder below writes differently: a value made of them only is its
# own JSON, URL, shell and repr form.
_PLAIN = re.compile(r"[A-Za-z0-9_.\-]*")


def forms(value: str) -> set[bytes]:
    """Every covered form of ``value``, as UTF-8 bytes (the value itself included)."""
    found: set[bytes] = set()
    for base in dict.fromkeys([value, *_normal_forms(value)]):
        data = base.encode("utf-8", "surrogatepass")
        found.update(_base64_cores(data))
        found.update((data.hex().encode(), data.hex().upper().encode()))
        if _PLAIN.fullmatch(base):
            found.add(data)
            continue
        texts = {base, *_json_forms(base), *_url_forms(base), *_shell_forms(base)}
        texts.update(_python_forms(base))
        found.update(text.encode("utf-8", "surrogatepass") for text in texts)
    return found


def _normal_forms(value: str) -> list[str]:
    try:
        return [unicodedata.normalize("NFC", value), unicodedata.normalize("NFD", value)]
    except ValueError:  # not every string is normalisable
        return []


def _json(text: str, *, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


def json_raw(text: str) -> str:
    return _json(text, ascii_only=False)


def json_ascii(text: str) -> str:
    return _json(text, ascii_only=True)


def json_upper(text: str) -> str:
    return _HEX_ESCAPE.sub(lambda m: "\\u" + m.group()[2:].upper(), json_ascii(text))


def json_php(text: str) -> str:
    return json_ascii(text).replace("/", "\\/")


def json_php_unicode(text: str) -> str:
    return json_raw(text).replace("/", "\\/")


_GO = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_DOTNET = {ch: f"\\u{ord(ch):04X}" for ch in "<>&'+`"}


def json_go(text: str) -> str:
    return "".join(_GO.get(ch, ch) for ch in json_raw(text))


def json_dotnet(text: str) -> str:
    escaped = json_upper(text).replace('\\"', "\\u0022")
    return "".join(_DOTNET.get(ch, ch) for ch in escaped)


# Chains of any of these (up to three levels); the others are applied alone at each level.
MIXED_ENCODERS: tuple[Encoder, ...] = (json_raw, json_ascii)
UNIFORM_ENCODERS: tuple[Encoder, ...] = (
    json_upper,
    json_php,
    json_php_unicode,
    json_go,
    json_dotnet,
)
JSON_LEVELS = 3


def _json_forms(text: str) -> set[str]:
    found: set[str] = set()
    level = {text}
    for _ in range(JSON_LEVELS):
        level = {encode(item) for item in level for encode in MIXED_ENCODERS}
        found |= level
    for encode in UNIFORM_ENCODERS:
        item = text
        for _ in range(JSON_LEVELS):
            item = encode(item)
            found.add(item)
    return found


def _url_forms(text: str) -> set[str]:
    encoded = {
        quote(text, safe=""),
        quote(text, safe="/"),
        quote(text, safe=_URI_COMPONENT_SAFE),
        quote_plus(text, safe=""),
    }
    return encoded | {_PERCENT.sub(lambda m: m.group().lower(), item) for item in encoded}


def _shell_forms(text: str) -> set[str]:
    """Inside single quotes, as bash's ``set -x`` (``'\\''``) and ``shlex.quote``
    (``'"'"'``) close, escape and reopen them around a quote."""
    return {text.replace("'", "'\\''"), text.replace("'", "'\"'\"'")}


def _python_forms(text: str) -> set[str]:
    """The inside of ``repr`` and ``ascii`` of the text (with either quote: ``repr`` picks
    one by the whole string the value is part of) and of ``repr`` of its UTF-8 bytes."""
    found: set[str] = set()
    for quote_char in "'\"":
        found.add(_quoted(text, quote_char, repr))
        found.add(_quoted(text, quote_char, ascii))
        data = text.encode("utf-8", "surrogatepass")
        found.add("".join(_byte_repr(byte, quote_char) for byte in data))
    return found


def _quoted(text: str, quote_char: str, show: Callable[[object], str]) -> str:
    return "".join(
        ("\\" + ch if ch == quote_char else ch) if ch in "'\"" else show(ch)[1:-1] for ch in text
    )


def _byte_repr(byte: int, quote_char: str) -> str:
    ch = chr(byte)
    if ch in "'\"":
        return "\\" + ch if ch == quote_char else ch
    return repr(bytes([byte]))[2:-1]


def _base64_cores(data: bytes) -> Iterable[bytes]:
    """The base64 characters of ``data`` that its neighbours cannot change, with 0, 1 or 2
    bytes before it in the encoded stream (standard and URL-safe alphabets); and, at the
    end of the stream, the last partial character too."""
    for before in range(3):
        encoded = base64.b64encode(bytes(before) + data)
        skip = (0, 2, 3)[before]  # characters holding bits of the bytes before
        whole, left = divmod(before + len(data), 3)
        end = whole * 4 + left  # a partial group: 1 byte gives 1 whole character, 2 give 2
        for core in (encoded[skip:end], encoded[skip:].rstrip(b"=")):  # the latter: at the end
            yield core
            yield core.translate(_URLSAFE)


_URLSAFE = bytes.maketrans(b"+/", b"-_")
