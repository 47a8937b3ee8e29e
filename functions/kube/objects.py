"""Kubernetes objects decoded one at a time from the raw JSON of a LIST page or a watch line,
each within ``Bounds``.

Tenants write the objects a controller lists: one nested thousands of levels deep (Python's
``json`` raises RecursionError, failing the whole response) or of megabytes (ten times that
as Python objects) must fail alone. ``list_page`` and ``watch_event`` read the bytes event by
event with ijson's C parser (no recursion, the page never whole in memory) and build each
object here, iteratively; one past its bounds comes out as ``Undecodable``, still read to its
end for what identifies it (its metadata, and the strings at the paths the caller marks), so
the caller reports it and goes on. ``metadata.managedFields`` is dropped on the way: no
caller needs it, it repeats the object's shape (its depth too), and an update without it
keeps the server's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import IO, Any

import ijson

IDENTITY = ("metadata.namespace", "metadata.name", "metadata.uid", "metadata.resourceVersion")
DROPPED = ("metadata", "managedFields")
Event = tuple[str, Any]


@dataclass(frozen=True)
class Bounds:
    depth: int = 100  # nesting levels of an object (``{}`` is 1)
    size: int = 512 * 1024  # bytes, counted as keys and strings plus 8 per other value


@dataclass(frozen=True)
class Undecodable:
    """An object left out: why, and the strings found at ``IDENTITY`` and the marked paths
    (dotted, ``*`` for an array's members) until its end."""

    reason: str
    limit: str  # which: "depth", "size" or "shape" (not an object)
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.marks.get("metadata.namespace", "")

    @property
    def name(self) -> str:
        return self.marks.get("metadata.name", "")

    @property
    def uid(self) -> str:
        return self.marks.get("metadata.uid", "")

    @property
    def resource_version(self) -> str:
        return self.marks.get("metadata.resourceVersion", "")


Decoded = dict[str, Any] | Undecodable


@dataclass(frozen=True)
class ListEnd:
    """What a LIST page says after its items: its ``resourceVersion`` (to watch from) and
    ``continue`` (the next page's token; empty on the last)."""

    resource_version: str
    continue_token: str


def list_page(
    stream: IO[bytes] | bytes, bounds: Bounds, marks: tuple[str, ...] = ()
) -> Iterator[Decoded | ListEnd]:
    """Each item of a LIST response as it is read, then its ``ListEnd``; raises
    ``ValueError`` when the response is no JSON object (cut short, say)."""
    events = _events(stream)
    _expect(events, "start_map")
    meta: dict[str, Any] = {}
    for key in _keys(events):
        first = next(events)
        if key == "items" and first[0] == "start_array":
            for item in _members(events):
                yield _value(events, item, bounds, (*IDENTITY, *marks))
        elif key == "metadata" and first[0] == "start_map":
            found = _value(events, first, Bounds(depth=4, size=64 * 1024), ())
            meta = found if isinstance(found, dict) else {}
        else:
            _value(events, first, Bounds(depth=0, size=0), ())
    yield ListEnd(str(meta.get("resourceVersion") or ""), str(meta.get("continue") or ""))


def single(
    stream: IO[bytes] | bytes, bounds: Bounds, marks: tuple[str, ...] = ()
) -> Iterator[Decoded]:
    """The one object of a GET's (or an update's) response; raises ``ValueError`` when the
    response is no JSON object."""
    events = _events(stream)
    yield _value(events, next(events, ("end of input", None)), bounds, (*IDENTITY, *marks))


def watch_event(line: bytes, bounds: Bounds, marks: tuple[str, ...] = ()) -> tuple[str, Decoded]:
    """A watch line's ``(type, object)``; raises ``ValueError`` for a line that is no JSON
    object."""
    events = _events(line)
    _expect(events, "start_map")
    kind = ""
    found: Decoded = Undecodable("no object in the watch event", "shape")
    for key in _keys(events):
        first = next(events)
        if key == "type" and first[0] == "string":
            kind = first[1]
        elif key == "object":
            found = _value(events, first, bounds, (*IDENTITY, *marks))
        else:
            _value(events, first, Bounds(depth=0, size=0), ())
    return kind, found


def _events(source: IO[bytes] | bytes) -> Iterator[Event]:
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    try:
        # Numbers as text (ints, Decimals): yajl's own integers overflow at int64, and the
        # API server writes a float such as 1e20 with all its digits.
        yield from ijson.basic_parse(stream)
    except ijson.JSONError as err:
        raise ValueError(f"not JSON: {err}") from err


def _expect(events: Iterator[Event], kind: str) -> None:
    got = next(events, ("end of input", None))[0]
    if got != kind:
        raise ValueError(f"expected {kind}, found {got}")


def _keys(events: Iterator[Event]) -> Iterator[str]:
    """The keys of the map just opened, each followed by its value's events (the caller reads
    them before asking for the next key)."""
    for event, value in events:
        if event == "end_map":
            return
        yield value


def _members(events: Iterator[Event]) -> Iterator[Event]:
    """The first event of each member of the array just opened (the caller reads the rest)."""
    for event in events:
        if event[0] == "end_array":
            return
        yield event


def _value(
    events: Iterator[Event], first: Event, bounds: Bounds, marks: tuple[str, ...]
) -> Decoded:
    """The JSON value that starts with ``first``, built unless past ``bounds`` (then read to
    its end all the same); a scalar at the top comes back ``Undecodable``."""
    return _Builder(bounds, frozenset(marks)).read(events, first)


class _Builder:
    def __init__(self, bounds: Bounds, marks: frozenset[str]) -> None:
        self.bounds = bounds
        self.marks = marks
        # A mark is a string this many containers deep at most: deeper ones are never looked up
        # (the path's join would cost as much as the nesting, a tenant's choice).
        self.mark_depth = max((m.count(".") + 1 for m in marks), default=0)
        self.found: dict[str, str] = {}
        self.path: list[str] = []  # the key of each open container ("*": an array's member)
        self.arrays: list[bool] = []  # whether each open container is an array
        self.built: list[Any] = []  # the open containers, while building
        self.size = 0
        self.reason = ""
        self.limit = ""
        self.dropping = 0  # open containers of a dropped member (managedFields)

    def read(self, events: Iterator[Event], first: Event) -> Decoded:
        if first[0] not in ("start_map", "start_array"):
            return Undecodable("not an object", "shape")
        named = ""  # the last key read in the innermost map
        kind, value = first
        while True:
            key = "*" if self.arrays and self.arrays[-1] else named
            if kind == "map_key":
                named = value
                self.size += len(value) + 3
            elif kind in ("start_map", "start_array"):
                self._open(kind == "start_array", key)
            elif kind in ("end_map", "end_array"):
                done = self._close()
                if done is not None:
                    return done
            else:
                self._scalar(key, value)
            kind, value = next(events)

    def _open(self, is_array: bool, key: str) -> None:
        self.path.append(key)
        self.arrays.append(is_array)
        if self.dropping or (
            len(self.path) == len(DROPPED) + 1 and tuple(self.path[1:]) == DROPPED
        ):
            self.dropping += 1
            return
        deep = len(self.path) > self.bounds.depth
        self._over(deep, "depth", f"nested deeper than {self.bounds.depth} levels")
        if self.reason:
            return
        made: Any = [] if is_array else {}
        if self.built:
            self._put(made, key)
        self.built.append(made)

    def _close(self) -> Decoded | None:
        self.path.pop()
        self.arrays.pop()
        if self.dropping:
            self.dropping -= 1
            return None
        if self.path:
            if not self.reason:
                self.built.pop()
            return None
        return Undecodable(self.reason, self.limit, self.found) if self.reason else self.built.pop()

    def _scalar(self, key: str, value: Any) -> None:
        if self.dropping:
            return
        if isinstance(value, str):
            self.size += len(value) + 2
            if len(self.path) <= self.mark_depth:
                dotted = ".".join([*self.path[1:], key])
                if dotted in self.marks:
                    self.found[dotted] = value
        else:
            value = float(value) if isinstance(value, Decimal) else value
            self.size += 8
        large = self.size > self.bounds.size
        self._over(large, "size", f"larger than {self.bounds.size} bytes")
        if not self.reason:
            self._put(value, key)

    def _put(self, value: Any, key: str) -> None:
        into = self.built[-1]
        if isinstance(into, list):
            into.append(value)
        else:
            into[key] = value

    def _over(self, over: bool, limit: str, why: str) -> None:
        if over and not self.reason:
            self.reason, self.limit = why, limit
            self.built.clear()
