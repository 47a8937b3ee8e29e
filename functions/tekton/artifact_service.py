"""The artifacts service: where a Tekton Task's steps fetch a Get's artifact and hand over a
directory for a Put, with the Task pod's own identity, so no pipeline namespace holds a store
credential (``resource-functions serve artifacts``; docs/tekton.md).

A step shows a projected ServiceAccount token for ``ARTIFACT_AUDIENCE``. The service has the
API server review it (TokenReview: signature, expiry, audience, the account still exists),
takes the namespace of its ServiceAccount, and the team that namespace serves
(``namespace_teams.NamespaceTeams``: as the controller maps it). Then:

- ``GET /artifacts?url=URL``: the artifact's bytes, only when its team record names that team,
  checked before anything is read (403 otherwise); only artifacts, never a record.
- ``POST /artifacts?format=zstd|gzip|none`` (the body: a packed directory, streamed): a new
  artifact under ``artifacts/inputs/``, recorded as the Task's team's whatever the step says;
  ``201`` with ``{"url", "digest", "size", "format"}``, digest and size as stored.

What a team and a replica take in uploads is bounded (``uploads.py``: uploads at once per
replica, a team's uploads and bytes per hour, the format's first bytes checked).

Errors are JSON ``{"error": {"kind", "message"}}``: 400 (not an artifact of this store, not
the format said), 401 (no valid token), 403 (namespace serving no team, another team's
artifact), 404, 413 (over ``ARCHIVE_MAX_TOTAL_BYTES``), 429 with ``Retry-After`` (the
replica's uploads at once, the team's quota), 503 (the store or the API is away: try again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, BinaryIO, cast

from flask import Flask, Response, jsonify, request

from functions import keys
from functions.errors import NotAuthenticated, SenderNotAllowed, Unavailable
from functions.http.senders import SenderCheck
from functions.logs import fields
from functions.settings import Settings
from functions.tekton.namespace_teams import NamespaceTeams
from functions.tekton.uploads import PART_CONCURRENCY, Busy, FormatChecked, NotTheFormat, Uploads
from storage import Store, open_store
from storage.archive import FORMATS, format_for_key, suffix_for
from storage.artifacts import add_team, teams_of
from storage.base import key_for_url
from storage.store_errors import StorageError

CHUNK = 1 << 20
IDLE_SECONDS = 60.0  # an upload whose client sends nothing this long is dropped
MIN_RATE = 64 * 1024  # bytes a second an upload's body must keep up on average ...
RATE_GRACE_SECONDS = 30.0  # ... after this long (a pack starts slowly: it compresses first)
SERVICE_ACCOUNT = "system:serviceaccount:"
log = logging.getLogger("functions.tekton.artifact_service")


class Refused(Exception):
    """A request this service will not serve; ``status`` and ``kind`` say how."""

    def __init__(self, status: int, kind: str, message: str, retry_after: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.retry_after = retry_after


class TooLarge(Exception):
    """An upload over the size bound."""


class TooSlow(Exception):
    """An upload whose body comes slower than ``MIN_RATE`` (after ``RATE_GRACE_SECONDS``)."""


def create_artifacts_app(
    store: Store, tokens: SenderCheck, teams: NamespaceTeams, max_bytes: int, uploads: Uploads
) -> Flask:
    app = Flask("resource-functions-artifacts")
    app.add_url_rule("/artifacts", "fetch", lambda: _fetch(store, tokens, teams), methods=["GET"])
    app.add_url_rule(
        "/artifacts",
        "hand_over",
        lambda: _hand_over(store, tokens, teams, max_bytes, uploads),
        methods=["POST"],
    )
    app.add_url_rule("/healthz", "healthz", lambda: {"status": "ok", "action": "artifacts"})
    app.register_error_handler(Refused, _refused)
    app.extensions["store"] = store
    return app


def artifacts_app_from(settings: Settings) -> Flask:
    """The service as ``serve artifacts`` runs it: the store of ``STORE_URL``, tokens reviewed
    by the API server for ``ARTIFACT_AUDIENCE``, teams as the controller maps them, uploads up
    to ``ARCHIVE_MAX_TOTAL_BYTES``."""
    from functions.kube.api import KubeApi, api_client_from_env

    options = replace(settings.store_options, threads=settings.threads)
    store = open_store(settings.store_url, replace(options, concurrency=PART_CONCURRENCY))
    api = KubeApi(api_client_from_env(settings.kubeconfig), "", (5.0, 10.0))
    tokens = SenderCheck(api.review_token, settings.artifact_audience, (f"{SERVICE_ACCOUNT}*",))
    teams = NamespaceTeams(settings.tekton_teams, api.namespace_labels)
    uploads = Uploads(store, settings.uploads)
    return create_artifacts_app(store, tokens, teams, settings.limits.max_total_bytes, uploads)


def team_of_caller(tokens: SenderCheck, teams: NamespaceTeams) -> tuple[str, str]:
    """``(namespace, team)`` of the ServiceAccount behind the request's bearer token."""
    try:
        user = tokens.sender(request.headers.get("Authorization"))
    except NotAuthenticated as err:
        raise Refused(401, "not_authenticated", str(err)) from None
    except SenderNotAllowed as err:
        raise Refused(403, "not_allowed", str(err)) from None
    except Unavailable as err:
        raise Refused(503, "unavailable", str(err)) from None
    namespace = user[len(SERVICE_ACCOUNT) :].partition(":")[0]
    try:
        team = teams.team_of(namespace)
    except Unavailable as err:
        raise Refused(503, "unavailable", str(err)) from None
    if team is None:
        raise Refused(403, "team_not_allowed", teams.refusal(namespace))
    return namespace, team


def _fetch(store: Store, tokens: SenderCheck, teams: NamespaceTeams) -> Response:
    namespace, team = team_of_caller(tokens, teams)
    url = request.args.get("url", "")
    key = artifact_key(store, url)
    try:
        if team not in teams_of(store, key):
            raise Refused(
                403,
                "input_not_allowed",
                f"{url} is not an artifact of team {team!r} (namespace {namespace!r})",
            )
        info = store.stat(key)
        if info is None:
            raise Refused(404, "not_found", f"{url} does not exist")
        stream = store.open(key)
    except StorageError as err:
        raise Refused(503, "unavailable", f"the store: {err}") from None
    log.info("artifact fetched", extra=fields(team=team, key=key, size=info.size))
    headers = {"Content-Length": str(info.size)}
    return Response(_chunks(stream), headers=headers, mimetype="application/octet-stream")


def _hand_over(
    store: Store, tokens: SenderCheck, teams: NamespaceTeams, max_bytes: int, uploads: Uploads
) -> tuple[Response, int]:
    _, team = team_of_caller(tokens, teams)
    format = request.args.get("format", "zstd")
    if format not in FORMATS:
        raise Refused(400, "invalid_request", f"format {format!r} is not one of {FORMATS}")
    now = datetime.now(UTC)
    key = keys.input_key(suffix_for(format), now)
    body = FormatChecked(Bounded(request.stream, max_bytes, request.environ), format)
    try:
        with uploads.slot(team, now):
            info = store.put(key, cast(BinaryIO, body))
            add_team(store, key, team)
            uploads.counted(team, info.size, now)
    except Busy as err:
        raise Refused(429, "busy", str(err), err.retry_after) from None
    except NotTheFormat as err:
        raise Refused(400, "invalid_request", str(err)) from None
    except TooLarge:
        raise Refused(413, "too_large", f"the artifact is larger than {max_bytes} bytes") from None
    except TooSlow:
        problem = f"the upload came slower than {MIN_RATE} bytes a second"
        raise Refused(408, "invalid_request", problem) from None
    except StorageError as err:
        raise Refused(503, "unavailable", f"the store: {err}") from None
    log.info("artifact handed over", extra=fields(team=team, key=key, size=info.size))
    found = {"url": store.url_for(key), "digest": info.digest or "", "size": info.size}
    return jsonify({**found, "format": format}), 201


def artifact_key(store: Store, url: str) -> str:
    """The store key of an artifact's URL; ``Refused`` (400) for anything else: another
    store's object, a record, a key outside ``artifacts/``."""
    key = key_for_url(store, url) if url else None
    if key is None or not key.startswith(keys.ARTIFACTS):
        raise Refused(400, "invalid_request", f"{url!r} is not an artifact URL of {store.url}")
    try:
        format_for_key(key)
    except ValueError:
        problem = f"{url!r} is not an artifact (no archive suffix)"
        raise Refused(400, "invalid_request", problem) from None
    return key


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    with stream:
        while chunk := stream.read(CHUNK):
            yield chunk


class Bounded:
    """The request body as a stream the store reads: at most ``limit`` bytes, each read
    waiting at most ``IDLE_SECONDS`` for the client (gunicorn's socket)."""

    def __init__(self, stream: Any, limit: int, environ: dict[str, Any]) -> None:
        self._stream = stream
        self._limit = limit
        self._seen = 0
        self._socket = environ.get("gunicorn.socket")
        self._started = time.monotonic()

    def read(self, size: int = -1) -> bytes:
        if self._socket is not None:
            self._socket.settimeout(IDLE_SECONDS)
        chunk = bytes(self._stream.read(CHUNK if size < 0 else min(size, CHUNK)))
        self._seen += len(chunk)
        if self._seen > self._limit:
            raise TooLarge()
        took = time.monotonic() - self._started
        if chunk and took > RATE_GRACE_SECONDS and self._seen < MIN_RATE * took:
            raise TooSlow()
        return chunk

    def readable(self) -> bool:
        return True


def _refused(err: Refused) -> tuple[Response, int]:
    if err.status >= 500:
        log.warning("artifacts: %s", err)
    answer = jsonify({"error": {"kind": err.kind, "message": str(err)}})
    if err.retry_after:
        answer.headers["Retry-After"] = str(err.retry_after)
    return answer, err.status
