"""A directory to an artifact and back, outside the functions: ``resource-functions artifact
pack|unpack`` (a Tekton step's files in and out of a workspace, through the artifacts service
with the pod's own token: ``ArtifactsService``; docs/tekton.md) and ``run``'s local inputs and
output (straight to a store).

An artifact is what a get answers with: ``{"url", "digest", "size", "format"}``. Packing
writes a new object under ``artifacts/inputs/`` (write-once, never a cached get's key);
unpacking verifies the digest and extracts as safely as a task's stage step does.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import requests

from functions import keys
from storage import Store
from storage.archive import ArchiveOptions, Limits, format_for_key, suffix_for
from storage.archive import pack as pack_tree
from storage.archive import unpack as unpack_stream
from storage.artifacts import StreamWrapper, add_team, download_tree, upload_tree
from storage.base import is_digest, key_for_url

BUSY_WAIT_SECONDS = 900.0  # what pack waits in all for a busy service (429) before failing
RESET_WAIT_SECONDS = 5.0  # before packing again after the service cut the connection


class BadArtifact(ValueError):
    """The artifact given to unpack is not one of this store's, or says no digest; or the
    directory to unpack it into cannot be written."""


def unwritable(directory: Path) -> str:
    """Why unpack cannot write into ``directory``, and the usual cause in a Tekton Task."""
    found = directory.stat()
    return (
        f"{directory} exists and this step (uid {os.getuid()}) cannot write into it (owner uid "
        f"{found.st_uid}, mode {stat.S_IMODE(found.st_mode):04o}). Tekton creates every "
        "step's workingDir before the first step runs, as its own user: unpack into a "
        "directory that no step names as its workingDir (a later step may cd into it)"
    )


def _as_is(stream: BinaryIO) -> BinaryIO:
    return stream


def pack(
    store: Store,
    directory: Path,
    options: ArchiveOptions,
    *,
    team: str,
    wrap: StreamWrapper = _as_is,
) -> dict[str, Any]:
    """Upload ``directory`` as a new artifact of ``team`` (a put of that team may take it
    as an input, no other team's); the artifact, as a get answers with one."""
    if not directory.is_dir():
        raise BadArtifact(f"{directory} is not a directory")
    key = keys.input_key(suffix_for(options.format), datetime.now(UTC))
    info = upload_tree(store, key, directory, options, wrap=wrap)
    add_team(store, key, team)
    return {
        "url": store.url_for(key),
        "digest": info.digest or "",
        "size": info.size,
        "format": options.format,
    }


def writable_directory(directory: Path) -> None:
    """Create ``directory`` if need be; ``BadArtifact`` when this step cannot write into it."""
    if not directory.is_dir():
        directory.mkdir(parents=True)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BadArtifact(unwritable(directory))


def parse_artifact(text: str) -> dict[str, Any]:
    """An artifact given as JSON text (a Get's ``artifact`` result)."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise BadArtifact(f"the artifact is not JSON: {err}") from None
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise BadArtifact('the artifact must be a JSON object with "url" and "digest"')
    return value


def unpack(
    store: Store,
    artifact: dict[str, Any],
    directory: Path,
    limits: Limits,
    wrap: StreamWrapper = _as_is,
) -> None:
    """Extract ``artifact`` into ``directory``, its bytes checked against its digest."""
    key = key_for_url(store, artifact["url"])
    if key is None:
        raise BadArtifact(f"{artifact['url']} is not an object of {store.url}")
    digest = artifact.get("digest")
    if not isinstance(digest, str) or not is_digest(digest):
        raise BadArtifact("the artifact has no digest ('sha256:' and 64 hex digits) to verify")
    writable_directory(directory)
    download_tree(store, key, directory, expected_digest=digest, limits=limits, wrap=wrap)


class ArtifactsService:
    """The artifacts service (``functions.tekton.artifact_service``) as a Task's step reaches it: its
    URL, and the file of the pod's projected ServiceAccount token for its audience (read at
    each call: the kubelet renews it)."""

    def __init__(self, url: str, token_file: str | os.PathLike[str]) -> None:
        self.url = url.rstrip("/") + "/artifacts"
        self.token_file = Path(token_file)

    def _headers(self) -> dict[str, str]:
        try:
            token = self.token_file.read_text().strip()
        except OSError as err:
            raise BadArtifact(
                f"cannot read the ServiceAccount token {self.token_file}: {err.strerror} (does "
                "the Task declare the projected token volume? docs/tekton.md)"
            ) from None
        return {"Authorization": f"Bearer {token}"}

    def unpack(self, artifact: dict[str, Any], directory: Path, limits: Limits) -> None:
        """Extract ``artifact`` into ``directory``, its bytes checked against its digest."""
        url, digest = artifact["url"], artifact.get("digest")
        if not isinstance(digest, str) or not is_digest(digest):
            raise BadArtifact("the artifact has no digest ('sha256:' and 64 hex digits) to verify")
        try:
            format = format_for_key(url)
        except ValueError:
            raise BadArtifact(f"{url} is not an artifact (no archive suffix)") from None
        writable_directory(directory)
        with _answer(
            requests.get(
                self.url, params={"url": url}, headers=self._headers(), stream=True, timeout=60
            )
        ) as response:
            response.raw.decode_content = False
            unpack_stream(
                response.raw, directory, format=format, expected_digest=digest, limits=limits
            )

    def pack(self, directory: Path, options: ArchiveOptions) -> dict[str, Any]:
        """Hand ``directory`` over as a new artifact of the Task's team; the artifact. A 429
        (the replica's uploads at once, the team's quota) is waited out as its
        ``Retry-After`` says, up to ``BUSY_WAIT_SECONDS`` in all."""
        if not directory.is_dir():
            raise BadArtifact(f"{directory} is not a directory")
        waited = 0.0
        while True:
            with pack_tree(directory, options) as stream:
                body = iter(lambda: stream.read(1 << 20), b"")
                try:
                    response = requests.post(
                        self.url,
                        params={"format": options.format},
                        headers=self._headers(),
                        data=body,
                        timeout=60,
                    )
                except requests.ConnectionError:
                    # A 429 sent before the body was read may reach us as a reset instead.
                    if waited + RESET_WAIT_SECONDS > BUSY_WAIT_SECONDS:
                        raise
                    time.sleep(RESET_WAIT_SECONDS)
                    waited += RESET_WAIT_SECONDS
                    continue
            pause = _retry_after(response)
            if pause is None or waited + pause > BUSY_WAIT_SECONDS:
                with _answer(response) as answered:
                    return dict(answered.json())
            response.close()
            print(
                f"artifacts service busy: {_message(response)}; again in {pause} s", file=sys.stderr
            )
            time.sleep(pause)
            waited += pause


def _retry_after(response: requests.Response) -> int | None:
    """Seconds to wait before asking again, for a 429; None for any other answer."""
    if response.status_code != 429:
        return None
    value = response.headers.get("Retry-After", "")
    return max(1, min(int(value), 300)) if value.isdigit() else 10


def _message(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


class _answer:
    """A response of the service as a context: ``BadArtifact`` with its message unless 2xx."""

    def __init__(self, response: requests.Response) -> None:
        self.response = response

    def __enter__(self) -> requests.Response:
        if self.response.status_code >= 300:
            message = _message(self.response)
            self.response.close()
            raise BadArtifact(
                f"the artifacts service answered {self.response.status_code}: {message}"
            )
        return self.response

    def __exit__(self, *_exc: object) -> None:
        self.response.close()
