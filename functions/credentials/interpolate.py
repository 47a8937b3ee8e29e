"""Finding and replacing ``((name))`` / ``((name.field))`` in JSON values (pure).

Concourse's syntax: a reference is the whole string or part of it; ``((name.field))`` selects a
key of the credential. Only string *values* are interpolated, never object keys. What is inside
``((…))`` must be a plain name (letters, digits, ``_``, ``-``) and at most one field: var
sources (``((source:name))``), paths (``/``) and nested fields are refused, so a name can never
walk out of a directory or name an unrelated object.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from functions.errors import InvalidRequest

# Concourse's template pattern: what it treats as a reference at all.
REFERENCE = re.compile(r"\(\(([-/.:\w\"]+)\)\)")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,252}$")


@dataclass(frozen=True)
class Reference:
    name: str
    field: str | None = None

    def __str__(self) -> str:
        return f"(({self.name}{'.' + self.field if self.field else ''}))"


@dataclass(frozen=True)
class Resolved:
    """The request's values with every reference replaced, and the values put in."""

    source: dict[str, Any] = field(repr=False)
    params: dict[str, Any] = field(repr=False)
    version: dict[str, str] | None = field(repr=False)
    values: tuple[str, ...] = field(default=(), repr=False)


def parse_reference(text: str) -> Reference:
    """The reference inside ``((…))``; ``InvalidRequest`` if it is not one this service takes."""
    if ":" in text or "/" in text or '"' in text:
        raise InvalidRequest(
            f"(({text})): var sources, paths and quoted names are not "
            "supported; use ((name)) or ((name.field))"
        )
    name, _, field_name = text.partition(".")
    if not NAME.match(name) or (field_name and not NAME.match(field_name)):
        raise InvalidRequest(
            f"(({text})) is not a valid reference: use ((name)) or "
            "((name.field)), names of letters, digits, '_' and '-'"
        )
    return Reference(name, field_name or None)


def find_references(*values: Any) -> list[Reference]:
    """Every distinct reference in ``values``, in order of appearance."""
    found: dict[Reference, None] = {}
    for value in values:
        _walk(
            value,
            lambda s: found.update((parse_reference(m), None) for m in REFERENCE.findall(s)) or s,
        )
    return list(found)


def interpolate(value: Any, resolved: dict[Reference, str]) -> Any:
    """``value`` with each reference replaced by its resolved text (all must be resolved)."""
    return _walk(value, lambda s: REFERENCE.sub(lambda m: resolved[parse_reference(m.group(1))], s))


def _walk(value: Any, on_string: Callable[[str], Any]) -> Any:
    if isinstance(value, str):
        return on_string(value) if "((" in value else value
    if isinstance(value, dict):
        return {key: _walk(item, on_string) for key, item in value.items()}
    if isinstance(value, list):
        return [_walk(item, on_string) for item in value]
    return value
