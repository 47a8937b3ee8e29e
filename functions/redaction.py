"""Redaction of secrets from text a script printed (pure functions).

``redact(text, secrets)`` takes the set of secret strings and replaces every form in which
one can reappear: raw, JSON-escaped (``\\"``, ``\\\\``, ``\\t``, ``\\/``…), ``\\uXXXX``-escaped
(either hex case, surrogate pairs for astral characters) or any mix of those, and each of
these forms escaped once more (a JSON document quoted inside another). ``secret_strings``
says what the secrets of a stdin payload are: every string of ``source`` and ``params`` of
``MIN_SECRET_LEN`` characters or more (and each line of a multi-line one), and every number
of ``MIN_SECRET_DIGITS`` digits or more. Callers that know more secrets (resolved
credentials) add them to the set they pass.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

MIN_SECRET_LEN = 6
MIN_SECRET_DIGITS = 6
REDACTED = "[redacted]"

_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def secret_strings(stdin: bytes, extra: Iterable[str] = ()) -> list[str]:
    """The secrets of a stdin payload (its ``source`` and ``params``), plus ``extra``
    (resolved credential values: every one, whatever its length, and each of its lines),
    longest first."""
    try:
        payload = json.loads(stdin)
    except (ValueError, RecursionError):
        payload = None
    found = (
        secrets_in([payload.get("source"), payload.get("params")])
        if isinstance(payload, dict)
        else []
    )
    exact = {line for value in extra for line in (value, *value.splitlines()) if line.strip()}
    return sorted(set(found) | exact, key=lambda s: (-len(s), s))


def secrets_in(value: Any) -> list[str]:
    """Every secret-like scalar in a JSON value, longest first (walked without recursion,
    so no nesting depth can break it)."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
            found.update(line for line in item.splitlines() if line.strip())
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, (int, float)):
            text = json.dumps(item)
            if sum(ch.isdigit() for ch in text) >= MIN_SECRET_DIGITS:
                found.add(text)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    keep = (s for s in found if len(s) >= MIN_SECRET_LEN or _is_number(s))
    return sorted(keep, key=lambda s: (-len(s), s))


def _is_number(text: str) -> bool:
    digits = text.removeprefix("-")
    return digits.isdigit() and len(digits) >= MIN_SECRET_DIGITS


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every form of every secret replaced by ``[redacted]``."""
    wanted = tuple(sorted({s for s in secrets if s}, key=lambda s: (-len(s), s)))
    if not wanted or not text:
        return text
    return _pattern(wanted).sub(REDACTED, text)


@functools.lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str]:
    alternatives: list[str] = []
    for secret in secrets:  # longest first: a secret holding another is redacted whole
        forms = dict.fromkeys(
            [
                secret,
                _json_escaped(secret, ascii_only=False),
                _json_escaped(secret, ascii_only=True),
            ]
        )
        alternatives.extend(_any_escape(form) for form in forms)
    return re.compile("|".join(alternatives))


def _json_escaped(text: str, *, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


def _any_escape(text: str) -> str:
    """A regex matching ``text`` with each character raw or JSON-escaped in any way."""
    return "".join(_char(ch) for ch in text)


def _char(ch: str) -> str:
    if ch.isascii() and ch.isalnum():
        return ch
    alternatives = [re.escape(ch)]
    if ch in _SHORT_ESCAPES:
        alternatives.append(re.escape(_SHORT_ESCAPES[ch]))
    code = ord(ch)
    if code <= 0xFFFF:
        alternatives.append(_u_escape(code))
    else:
        code -= 0x10000
        alternatives.append(_u_escape(0xD800 + (code >> 10)) + _u_escape(0xDC00 + (code & 0x3FF)))
    return "(?:" + "|".join(alternatives) + ")"


def _u_escape(code: int) -> str:
    digits = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{code:04x}")
    return r"\\u" + digits
