"""Which values are secrets, and which of them can be redacted at all (pure).

``secret_values`` picks a run's secrets: every resolved ``((var))`` value; literal values of
``source`` and ``params`` only under a key that names a secret (``REDACT_KEYS``: globs,
matched case-insensitively, at any depth; everything below such a key); and the userinfo of
any URL in any of their strings. Other literal values stay readable in logs: a repository
URL, a branch name, a resource's own message.

``redactable`` applies the short-value policy, the same to every value: a value under
``MIN_CHARS`` characters (line breaks not counted) is never redacted (replacing it would reveal it, and wreck the
text); a multi-line value is redacted whole and line by line, but never a line of fewer than
``MIN_CHARS`` characters or one made only of punctuation and spaces (``{``, ``-----``).
"""

from __future__ import annotations

import fnmatch
import json
import re
import string
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

MIN_CHARS = 4
DEFAULT_REDACT_KEYS = (
    "*password*",
    "*passwd*",
    "*passphrase*",
    "*secret*",
    "*token*",
    "*credential*",
    "*private_key*",
    "*_key",
    "key",
    "*apikey*",
    "authorization",
)
# scheme://userinfo@host: the userinfo runs to the last "@" before the path, query or fragment.
# No scheme is required before "://": a pattern starting with the scheme's character class
# backtracks through every run of such characters from each of its positions, quadratic in a
# long value (a 64 KiB param took seconds); from "://" each scan ends at the next "/".
_USERINFO = re.compile(r"://([^\s/?#]*)@")
_NOT_ALONE = set(string.punctuation + string.whitespace)


def secret_values(
    *,
    source: dict[str, Any],
    params: dict[str, Any],
    resolved: Iterable[str] = (),
    keys: Iterable[str] = DEFAULT_REDACT_KEYS,
) -> tuple[str, ...]:
    """The values to redact from a run's output, longest first (any length: ``redactable``
    decides which can be)."""
    globs = tuple(key.lower() for key in keys)
    found = set(resolved)
    stack: list[tuple[Any, bool]] = [(source, False), (params, False)]
    while stack:  # no recursion: no nesting depth can break it
        item, secret = stack.pop()
        if isinstance(item, str):
            if secret:
                found.add(item)
            found.update(userinfo(item))
        elif isinstance(item, dict):
            stack.extend((v, secret or names_secret(str(k), globs)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, secret) for v in item)
        elif secret and isinstance(item, (int, float)) and not isinstance(item, bool):
            found.add(json.dumps(item))
    found.discard("")
    return tuple(sorted(found, key=lambda v: (-len(v), v)))


def names_secret(key: str, globs: Iterable[str]) -> bool:
    """Whether a key names a secret (``globs`` in lower case)."""
    name = key.lower()
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def userinfo(text: str) -> Iterator[str]:
    """The userinfo of each URL in ``text`` as written and decoded, and its password (or,
    without one, its user: a token given as the user name) alone."""
    for match in _USERINFO.finditer(text):
        info = match.group(1)
        user, colon, password = info.partition(":")
        alone = password if colon else user
        yield from (info, unquote(info), alone, unquote(alone))


def redactable(values: Iterable[str]) -> Iterator[str]:
    """The strings to look for: each value of ``MIN_CHARS`` characters or more, and each
    line of a multi-line value that may stand alone (as written, and without its indent)."""
    for value in values:
        if len(value.replace("\r", "").replace("\n", "")) < MIN_CHARS:
            continue
        yield value
        lines = value.splitlines()
        if len(lines) > 1:
            yield from (line for line in {*lines, *(x.strip() for x in lines)} if _alone(line))


def _alone(line: str) -> bool:
    return len(line) >= MIN_CHARS and not set(line) <= _NOT_ALONE
