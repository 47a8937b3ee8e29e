"""Clients that send headers and then stall mid-body must not take the service's request
threads for good: each stalled body times out (408) and /healthz keeps answering."""

from __future__ import annotations

import socket
import time

import requests

from tests.support.events import request_event, send
from tests.support.services import resource_types, start_services


def stall(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nce-specversion: 1.0\r\nce-id: s\r\n"
        b"ce-source: /s\r\nce-type: dev.resourcefunctions.check.requested\r\n"
        b'content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"type":'
    )
    return conn


def test_twenty_stalled_bodies_do_not_freeze_the_service(docker_host, resource_image, tmp_path):
    (tmp_path / "store").mkdir()
    env = {
        "DOCKER_HOST": docker_host,
        "RESOURCE_TYPES": resource_types(resource_image),
        "STORE_URL": (tmp_path / "store").as_uri(),
        "CACHE_SECRET": "e2e",
    }
    services = start_services(env, tmp_path / "services.log", actions=("check",))
    url = services.urls["check"]
    try:
        stalled = [stall(url) for _ in range(20)]
        time.sleep(0.5)
        started = time.monotonic()
        assert requests.get(url + "/healthz", timeout=15).status_code == 200
        assert time.monotonic() - started < 12
        for conn in stalled:  # each one is answered 408 and closed, not held
            conn.settimeout(15)
            assert b" 408 " in conn.recv(4096).split(b"\r\n", 1)[0]
            conn.close()
        status, reply, _ = send(
            url, request_event("check", {"type": "test", "source": {"count": 1}})
        )
        assert status == 200 and reply.get_data()["versions"] == [{"ref": "1"}]
    finally:
        services.stop()
