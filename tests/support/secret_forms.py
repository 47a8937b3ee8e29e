"""A secret in every form the redactor covers, made with the standard library (not with the
code under test), for the end-to-end tests: what a script prints, and the part of it that
must not survive (base64 keeps a few characters at each end: they hold bits of the bytes
around the secret too)."""

from __future__ import annotations

import base64
import json
import shlex
import unicodedata
from urllib.parse import quote, quote_plus

# '"', '\', "'", '@', '/', '+', '=', non-ASCII, a tab and a newline.
HOSTILE = "s3cr\"et\\v@l/u+e='é日本'\tend\nline-two"


def printed_forms(secret: str) -> dict[str, tuple[str, str]]:
    """Form name -> (the text a script prints, the part of it that must go)."""
    data = secret.encode()

    def b64(before: bytes, after: bytes, urlsafe: bool = False) -> tuple[str, str]:
        encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
        text = encode(before + data + after).decode()
        return text, text[4:-4]

    twice = json.dumps(json.dumps(secret))
    thrice = json.dumps(twice)
    forms = {
        "raw": (secret, secret),
        "json": (json.dumps(secret), json.dumps(secret)[1:-1]),
        "json twice": (twice, twice[3:-3]),
        "json three times": (thrice, thrice[7:-7]),
        "percent-encoded": (quote(secret, safe=""), quote(secret, safe="")),
        "form-encoded": (quote_plus(secret), quote_plus(secret)),
        "basic auth": b64(b"ci:", b""),
        "base64 after 1 byte": b64(b"x", b"!"),
        "url-safe base64 after 2 bytes": b64(b"xy", b"!!", urlsafe=True),
        "shell quotes": (shlex.quote(secret), shlex.quote(secret)[1:-1]),
        "python repr": (repr(secret), repr(secret)[1:-1]),
        "hex": (data.hex(), data.hex()),
        "NFD": (unicodedata.normalize("NFD", secret), unicodedata.normalize("NFD", secret)),
        "folded": (secret[:5] + "\r\n" + secret[5:], secret[:5] + "\r\n" + secret[5:]),
    }
    assert all(core in text for text, core in forms.values())
    return forms


def survivors(text: str, secret: str) -> list[str]:
    """The names of the forms of ``secret`` whose secret part is in ``text``."""
    flat = text.replace("\r", "").replace("\n", "")
    found = []
    for name, (_, core) in printed_forms(secret).items():
        if core in text or core.replace("\r", "").replace("\n", "") in flat:
            found.append(name)
    return found
