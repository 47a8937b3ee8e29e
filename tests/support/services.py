"""The services of a test deployment, started with the project's own launcher
(``functions.cli.launch``), their output in one log file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from functions.cli.launch import Launched, NotReady, launch

REPO = Path(__file__).resolve().parents[2]
CANARY = "canary-7d3f9b2e-do-not-leak"
E2E_CACHE_SECRET = "e2e-cache-secret"


@dataclass
class Services:
    """The services of one deployment, started as real processes."""

    launched: Launched
    log_path: Path
    env: dict[str, str]

    @property
    def urls(self) -> dict[str, str]:
        return self.launched.urls

    @property
    def procs(self) -> list:
        return list(self.launched.procs.values())

    def metric(self, action: str, name: str, **labels: str) -> float:
        text = requests.get(self.urls[action] + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.launched.stop()


def start_services(
    env_overrides: dict[str, str],
    log_path: Path,
    actions=("check", "get", "put"),
    host: str = "127.0.0.1",
) -> Services:
    """The services with this process's environment (less Knative's ``K_*``), the local
    runtime unless ``env_overrides`` says otherwise, once each serves; ``NotReady`` with the
    log's tail if one does not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("K_")}
    env.update({"RUNTIME": "container"})
    env.update(env_overrides)
    with open(log_path, "ab") as log:  # the children keep their own descriptor
        launched = launch(env, actions=actions, host=host, output=log)
    try:
        launched.wait_serving()
    except NotReady as err:
        launched.stop()
        raise NotReady(f"{err}; the services' log:\n{log_path.read_text()[-4000:]}") from err
    return Services(launched, log_path, env)


@contextmanager
def running_services(env: dict[str, str], log: Path, **options: Any) -> Iterator[Services]:
    """``start_services(env, log, ...)`` for the block, stopped (drained) after it."""
    services = start_services(env, log, **options)
    try:
        yield services
    finally:
        services.stop()


def resource_types(image: str, registry: str = "") -> str:
    """The test catalogue; ``registry``: the stub, whose "nope" image is unknown to it."""
    return json.dumps(
        {
            "test": image,
            "slow": {"image": image, "timeout_seconds": 3},
            "missing": f"{registry}/nope:1" if registry else "localhost/rf-no-such-image:1",
        }
    )
