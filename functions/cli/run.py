"""``python -m functions run``: one action in this process, as the services would run it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, BinaryIO, cast

from cloudevents.core.v1.event import CloudEvent

from functions import events
from functions.cli import artifact
from functions.cli.progress import ProgressReader
from functions.credentials import make_provider
from functions.http.app import open_local_or_remote_store
from functions.metrics import Metrics
from functions.model import Action
from functions.runtimes import make_runtime
from functions.service.config import ServiceConfig
from functions.service.service import Service
from functions.settings import Settings
from storage import Store


def run_local(
    action: Action, data: dict[str, Any], *, inputs: dict[str, str], output: Path | None
) -> dict[str, Any]:
    """Run ``action`` with request ``data``; local directories among ``inputs`` are uploaded
    first; a get's artifact is unpacked into ``output``. Returns the reply data."""
    settings = Settings.from_env()
    store = open_local_or_remote_store(settings)
    if inputs:
        team = str((data.get("build") or {}).get("team") or "")
        data["inputs"] = {
            name: _as_artifact(store, where, settings, team) for name, where in inputs.items()
        }
    runtime = make_runtime(settings, store)
    try:
        service = Service(
            action, ServiceConfig.of(settings), store, runtime, Metrics(), make_provider(settings)
        )
        reply = service.handle(_event(action, data))
    finally:
        runtime.close()
    body = events.reply_data_of(reply.event) if reply.event else {}
    if output is not None and "artifact" in body:
        _download(store, body["artifact"], output, settings)
    return body


def _event(action: Action, data: dict[str, Any]) -> CloudEvent:
    return CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": events.request_type(action),
            "source": "/cli",
            "id": str(uuid.uuid4()),
            "datacontenttype": "application/json",
        },
        data=data,
    )


def _as_artifact(store: Store, where: str, settings: Settings, team: str) -> str | dict[str, str]:
    """A URL as given; a directory uploaded as an artifact of ``team`` (the put's)."""
    if "://" in where:
        return where
    directory = Path(where)
    if not directory.is_dir():
        raise SystemExit(f"--input: {where} is neither a directory nor a URL")
    packed = artifact.pack(
        store,
        directory,
        settings.archive,
        team=team,
        wrap=lambda stream: cast(BinaryIO, ProgressReader(stream, f"upload {where}")),
    )
    return {"url": packed["url"], "digest": packed["digest"]}


def _download(store: Store, found: dict[str, Any], output: Path, settings: Settings) -> None:
    try:
        artifact.unpack(
            store,
            found,
            output,
            settings.limits,
            wrap=lambda stream: cast(BinaryIO, ProgressReader(stream, f"download to {output}")),
        )
    except artifact.BadArtifact as err:
        raise SystemExit(f"--output: {err}") from None
