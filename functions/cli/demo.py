"""``python -m functions demo``: the three services on this machine, and a real round trip.

Builds the example resource type in examples/hello-resource (busybox, no registry needed),
starts check/get/put under gunicorn on loopback with the embedded defaults (file store, local
container engine), then sends check → get → put CloudEvents over HTTP and prints each reply.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import requests
from cloudevents.core.bindings.http import HTTPMessage, from_http_event, to_binary_event
from cloudevents.core.v1.event import CloudEvent

from functions.cli.busybox_image import build_resource_image, scripts_hash
from functions.cli.launch import NotReady, launch, wait_until
from functions.model import ACTIONS
from functions.runtimes.local.container import engine_environment
from functions.settings import Settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "hello-resource"
PODMAN_SOCKET = "/run/podman/podman.sock"
IMAGE = "localhost/hello-resource"


def run_demo(*, serve: bool = False, base_port: int = 8081) -> int:
    env = dict(os.environ)
    env.setdefault("LOG_LEVEL", "warning")
    # A cache key of this run's own, shared by its three services (without one each service
    # would warn that it made up its own): cache entries last the run unless you set one.
    env.setdefault("CACHE_SECRET", secrets.token_hex(32))
    engine = None  # the Podman API service started here, if one was
    if "DOCKER_HOST" not in env:
        env["DOCKER_HOST"], engine = _engine(env)
    image = f"{IMAGE}:{scripts_hash(EXAMPLE)}"
    env["RESOURCE_TYPES"] = json.dumps({"hello": image})
    store = Settings.from_env(env).store_url
    # SIGTERM stops the demo as Ctrl-C does, so the services never outlive it.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    ports: dict[str, int] = {a: base_port + offset for offset, a in enumerate(ACTIONS)}
    services = launch(env, ports=ports)  # they boot while the image is built
    try:
        build_resource_image(IMAGE, EXAMPLE)
        if engine is not None:
            wait_until(lambda: Path(PODMAN_SOCKET).exists(), "podman system service")
        say(f"engine {env['DOCKER_HOST']}, store {store}, resource type hello = {image}")
        services.wait_serving()
        say("services: " + ", ".join(f"{a} {u}" for a, u in services.urls.items()))
        _round_trip(services.urls)
        if serve:
            say("services are up; Ctrl-C stops them. Try the curl examples in the README.")
            services.procs["check"].wait()
    except KeyboardInterrupt:
        pass
    except NotReady as err:
        raise SystemExit(f"did not come up: {err}") from err
    finally:
        signal.signal(signal.SIGTERM, previous)
        services.stop()
        say("the check, get and put services are stopped")
        if engine is not None:
            say(
                f"still running: the Podman API service this demo started on {env['DOCKER_HOST']}"
                f" (pid {engine.pid}; stop it with: kill {engine.pid})"
            )
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _engine(env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes] | None]:
    """A Docker-compatible socket: the usual one if present, or Podman's API service started
    now (not waited for; it keeps running after the demo)."""
    found = engine_environment(env).get("DOCKER_HOST")
    if found:
        return found, None
    Path(PODMAN_SOCKET).parent.mkdir(parents=True, exist_ok=True)
    engine = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{PODMAN_SOCKET}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return f"unix://{PODMAN_SOCKET}", engine


def _round_trip(urls: dict[str, str]) -> None:
    source = {"latest": "3", "greeting": "hello"}
    versions = _send(urls["check"], "check", {"type": "hello", "source": source})["versions"]
    got = _send(
        urls["get"],
        "get",
        {
            "type": "hello",
            "source": source,
            "version": versions[-1],
            "build": {"id": "1", "name": "1", "job": "demo"},
        },
    )
    again = _send(
        urls["get"],
        "get",
        {"type": "hello", "source": source, "version": versions[-1], "build": {"id": "2"}},
    )
    say(f"second get of the same version: cached={again['cached']} (no container started)")
    _send(
        urls["put"],
        "put",
        {
            "type": "hello",
            "source": source,
            "params": {"from": "greeting"},
            "inputs": {"greeting": got["artifact"]["url"]},
        },
    )


def _send(url: str, action: str, data: dict[str, Any]) -> dict[str, Any]:
    event = CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": f"dev.resourcefunctions.{action}.requested",
            "source": "/demo",
            "id": str(uuid.uuid4()),
            "datacontenttype": "application/json",
        },
        data=data,
    )
    message = to_binary_event(event)
    say(f"→ {action}: {json.dumps(data)}")
    response = requests.post(url, headers=dict(message.headers), data=message.body, timeout=600)
    if response.status_code != 200:
        raise SystemExit(f"{action} answered {response.status_code}: {response.text}")
    reply = from_http_event(HTTPMessage(headers=dict(response.headers), body=response.content))
    body = reply.get_data()
    assert isinstance(body, dict)
    say(f"← {reply.get_type()}: {json.dumps(body)}")
    if not reply.get_type().endswith(".succeeded"):
        raise SystemExit(f"{action} failed")
    return body


def say(text: str) -> None:
    print(text, flush=True)
