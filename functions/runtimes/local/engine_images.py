"""Images on the local engine (Docker/Podman): pulled when the engine lacks them, one pull per
image at a time (Podman asked through its own pull endpoint, which passes on the registry's
words), and an image reference's id remembered for a while (``image_ids``).

A registry's refusal is a problem text (the request's ``image_pull`` failure); registry
trouble that may pass and an engine that cannot be reached are ``Unavailable``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import docker.errors

from functions.errors import Unavailable, pull_is_transient
from functions.phases import PhaseClock
from functions.runtimes.local.attach import ENGINE_ERRORS
from functions.runtimes.local.image_ids import ImageIds


class EngineImages:
    def __init__(self, client: Any, id_seconds: float) -> None:
        self._client = client
        self._lock = threading.Lock()  # guards the pull locks
        self._pull_locks: dict[str, threading.Lock] = {}
        self._podman: bool | None = None  # the engine is Podman (known at the first pull)
        self._ids = ImageIds(id_seconds)

    def forget(self, image: str) -> None:
        """Ask the engine for ``image``'s id again next time (its warm container could not be
        had: the image removed?)."""
        self._ids.forget(image)

    def id_of(self, image: str, clock: PhaseClock) -> tuple[str, str | None]:
        """The id (``sha256:…``) of ``image``, pulled if the engine lacks it (the pull timed
        as ``clock``'s ``image_pull``); or the problem of its pull."""
        known = self._ids.get(image)
        if known:
            return known, None
        for _ in range(2):
            try:
                found = str(self._client.api.inspect_image(image)["Id"])
                self._ids.put(image, found)
                return found, None
            except docker.errors.ImageNotFound:
                pass
            except ENGINE_ERRORS as err:
                raise Unavailable(f"container engine: {err}") from err
            with clock.phase("image_pull"):
                problem = self.ensure(image)
            if problem:
                return "", problem
        raise Unavailable(f"image {image} vanished after its pull")

    def ensure(self, image: str) -> str | None:
        """Pull the image if the engine lacks it; a problem text if it can't be had. Registry
        trouble that may pass (``errors.pull_is_transient``: 5xx, 429, no answer in time) or
        an engine that cannot be reached is ``Unavailable``."""
        try:
            self._client.images.get(image)
            return None
        except docker.errors.ImageNotFound:
            pass
        except ENGINE_ERRORS as err:
            raise Unavailable(f"container engine: {err}") from err
        with self._pull_lock(image):
            try:
                refused = self._pull(image)
            except ENGINE_ERRORS as err:
                raise Unavailable(f"container engine: {err}") from err
        if refused is None:
            return None
        message, status = refused
        if pull_is_transient(message, status):
            raise Unavailable(f"cannot pull image {image} now: {message}")
        return f"cannot pull image {image}: {message}"

    def _pull(self, image: str) -> tuple[str, int] | None:
        """Pull ``image``: None once it is there, else the registry's refusal (its words and
        the API's status). Podman's Docker-compatible pull reports every refusal as "No such
        image", so with Podman its own pull endpoint is asked, which passes on what the
        registry said (a 503, a 429, "manifest unknown", "unauthorized")."""
        if self._is_podman():
            api = self._client.api
            params = {"reference": image, "quiet": "true"}
            answer = api.post(api._url("/libpod/images/pull"), params=params, stream=True)
            if answer.status_code >= 300:
                return answer.text, answer.status_code
            for line in answer.iter_lines():
                report = json.loads(line) if line.strip() else {}
                if report.get("error"):
                    return str(report["error"]), 0
            return None
        try:
            self._client.images.pull(image)
        except docker.errors.APIError as err:
            return _explain(err), err.status_code or 0
        return None

    def _is_podman(self) -> bool:
        """Whether the engine is Podman (asked once, at the first pull)."""
        if self._podman is None:
            components = self._client.version().get("Components") or []
            self._podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        return self._podman

    def _pull_lock(self, image: str) -> threading.Lock:
        """One pull per image at a time; different images pull in parallel."""
        with self._lock:
            return self._pull_locks.setdefault(image, threading.Lock())


def _explain(err: Exception) -> str:
    return str(getattr(err, "explanation", None) or err)
