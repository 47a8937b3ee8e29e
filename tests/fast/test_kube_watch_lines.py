"""A watch stream is read line by line (one JSON event each), whatever its chunking; a line
cut by the end of the stream is not an event."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import urllib3
from kubernetes import client

from functions.kube.api import KubeApi


class Chunked(io.RawIOBase):
    """A body that arrives ``size`` bytes at a time, as over a slow connection."""

    def __init__(self, data: bytes, size: int) -> None:
        self._data, self._size = io.BytesIO(data), size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(min(len(buffer), self._size))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def watched(body: bytes, chunk: int, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    api = KubeApi(client.ApiClient(), "ns", (1.0, 1.0))
    response = urllib3.HTTPResponse(body=Chunked(body, chunk), preload_content=False)
    monkeypatch.setattr(api, "_call", lambda *args, **kwargs: response)
    return list(api.watch_pods("job", "1", 1.0))


def event(name: str) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": name}}}).encode()


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_each_line_is_one_event_whatever_the_chunks(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = event("a") + b"\n\n" + event("b") + b"\n"
    names = [e["object"]["metadata"]["name"] for e in watched(body, chunk, monkeypatch)]
    assert names == ["a", "b"]


def test_a_line_cut_by_the_end_of_the_stream_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    body = event("a") + b"\n" + event("b")[:20]
    assert [e["object"]["metadata"]["name"] for e in watched(body, 5, monkeypatch)] == ["a"]
