"""Debian's Prometheus (``apt-get install prometheus``; ``.ci/setup`` does) as a test server:
its own config, storage dir and loopback port, scraping the targets it is given every second."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from functions.cli.launch import free_port
from testbed.process import ServerError, running

SCRAPE_SECONDS = 1


def scrape_config(jobs: Mapping[str, str]) -> dict[str, Any]:
    """One scrape job per name, of the ``host:port`` target given for it."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": [target]}]}
            for name, target in sorted(jobs.items())
        ],
    }


@contextmanager
def start_prometheus(jobs: Mapping[str, str], root: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise ServerError("prometheus is not installed (.ci/setup installs Debian's package)")
    root.mkdir(parents=True, exist_ok=True)
    config = root / "prometheus.yml"
    config.write_text(json.dumps(scrape_config(jobs)))  # JSON is YAML
    port = free_port()
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with running("prometheus", command, f"{url}/-/ready", root / "prometheus.log"):
        yield Prometheus(url)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar) ``expr`` evaluates to now; raises on a bad query."""
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise AssertionError(f"{expr}: {body}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def value(self, expr: str) -> float:
        """The single value of ``expr`` (0 when it has no series)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: more than one series: {result}"
        return float(result[0]["value"][1]) if result else 0.0

    def wait_for(self, expr: str, expected: float, timeout: float = 30) -> None:
        """Until ``expr`` has the value ``expected`` (the scrapes have caught up)."""
        deadline = time.monotonic() + timeout
        while (got := self.value(expr)) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr} is {got}, expected {expected}, after {timeout} s")
            time.sleep(0.2)
