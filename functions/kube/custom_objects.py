"""A kind of custom object as a controller uses it: list (paged, each object decoded alone
within ``Bounds``), watch, get, status writes guarded by the resourceVersion, and Events on
them; plain dicts, errors translated as the runtime's are (``api.translate``: 404/409
``NotFound``/``Conflict``, 401/403/5xx/unreachable ``Unavailable``). Every call has a timeout;
a watch ends when its server-side timeout does. The Tekton controller's CustomRuns
(``tekton_api``) and the scheduler's Resources (``functions.resources``) are two of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from functions.errors import Conflict, NotFound, Unavailable
from functions.kube import objects
from functions.kube.api import translate
from functions.kube.objects import Bounds, Decoded, ListEnd

PAGE = 250  # objects a LIST page holds: memory is a page's, never the cluster's


@dataclass(frozen=True)
class Kind:
    """A custom resource: its API group, version, plural and kind; the bounds an object of
    it is decoded within, and the paths an undecodable one still tells (``objects``)."""

    group: str
    version: str
    plural: str
    kind: str
    bounds: Bounds = field(default_factory=Bounds)
    marks: tuple[str, ...] = ()
    component: str = "resource-functions"  # an Event's reporting controller


class CustomObjects:
    def __init__(
        self,
        api_client: Any,
        kind: Kind,
        timeout: tuple[float, float] = (5.0, 30.0),
        counted: Callable[[], None] = lambda: None,
        page: int = PAGE,
    ) -> None:
        self.kind = kind
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout
        self._counted = counted  # called once per API request (the controller's metric)
        self._page = page

    def list(self) -> Iterator[Decoded | ListEnd]:
        """Every object of the kind in the cluster, a page (``PAGE``) at a time, each decoded
        alone (``objects``: one too deep or too large is ``Undecodable``); then the last
        page's ``ListEnd`` (its resourceVersion, to watch from). An expired ``continue`` is
        ``Gone``: list again."""
        k = self.kind
        token = ""
        while True:
            response = self._stream(
                "list",
                self._objects.list_cluster_custom_object,
                k.group,
                k.version,
                k.plural,
                limit=self._page,
                _continue=token or None,
            )
            end = None
            for found in self._decoded(response, objects.list_page, "list"):
                if isinstance(found, ListEnd):
                    end = found
                else:
                    yield found
            if end is None or not end.continue_token:
                yield end or ListEnd("", "")
                return
            token = end.continue_token

    def watch(self, resource_version: str, seconds: int) -> Iterator[tuple[str, Decoded]]:
        """``(type, object)`` of each change after ``resource_version`` for ``seconds``, each
        decoded alone (``objects.watch_event``); ``ERROR`` (410 Gone and friends) means:
        list again."""
        k = self.kind
        response = self._stream(
            "watch",
            self._objects.list_cluster_custom_object,
            k.group,
            k.version,
            k.plural,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=(self._timeout[0], seconds + 30),
        )
        yield from self._decoded(response, _watch_events, "watch")

    def read(self, namespace: str, name: str) -> Decoded | None:
        """The object, decoded within bounds as the LIST's are; ``None`` when gone."""
        k = self.kind
        try:
            response = self._stream(
                "get",
                self._objects.get_namespaced_custom_object,
                k.group,
                k.version,
                namespace,
                k.plural,
                name,
                namespace_=namespace,
            )
        except NotFound:
            return None
        found: Decoded = next(self._decoded(response, objects.single, "get"))
        return found

    def replace_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write ``status`` over ``obj``'s, guarded by its resourceVersion (``Conflict`` when
        it changed meanwhile, or came back past the bounds: read it again; ``NotFound`` when
        it is gone); the object as written."""
        k, meta = self.kind, obj["metadata"]
        response = self._stream(
            "update",
            self._objects.replace_namespaced_custom_object_status,
            k.group,
            k.version,
            meta["namespace"],
            k.plural,
            meta["name"],
            {**obj, "status": status},
            namespace_=meta["namespace"],
        )
        written: Decoded = next(self._decoded(response, objects.single, "update"))
        if isinstance(written, objects.Undecodable):
            raise Conflict(f"{k.kind.lower()} {meta['name']} came back {written.reason}")
        return written

    def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Merge ``status`` into ``obj``'s, guarded by its resourceVersion (``Conflict``),
        without reading the answer (the object may be one that cannot be decoded)."""
        k, meta = self.kind, obj["metadata"]
        response = self._stream(
            "patch",
            self._objects.patch_namespaced_custom_object_status,
            k.group,
            k.version,
            meta["namespace"],
            k.plural,
            meta["name"],
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
            namespace_=meta["namespace"],
        )
        _done(response)

    def event(self, obj: dict[str, Any], warning: bool, reason: str, message: str) -> None:
        """A Kubernetes Event on ``obj`` (``kubectl describe`` shows it)."""
        k, meta = self.kind, obj["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", f"{k.group}/{k.version}"),
                "kind": k.kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": "Warning" if warning else "Normal",
            "reason": reason[:128],
            "message": message[:1024],
            "source": {"component": k.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._json(
            "create",
            self._core.create_namespaced_event,
            meta["namespace"],
            body,
            namespace_=meta["namespace"],
        )

    # --- the one request path ------------------------------------------------------------------

    def _stream(
        self,
        verb: str,
        method: Callable[..., Any],
        *args: Any,
        namespace_: str = "",
        resource: str = "",
        **kw: Any,
    ) -> Any:
        """The response of ``method`` unread (the caller reads and releases it)."""
        kw.setdefault("_request_timeout", self._timeout)
        self._counted()
        try:
            return method(*args, **kw, _preload_content=False)
        except ApiException as err:
            raise translate(err, verb, resource or self.kind.plural, namespace_) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"Kubernetes API unreachable ({verb}): {err}") from err

    def _decoded(
        self, response: Any, decode: Callable[..., Iterator[Any]], verb: str
    ) -> Iterator[Any]:
        try:
            yield from decode(response, self.kind.bounds, self.kind.marks)
        except ValueError as err:  # cut short or not JSON: the API's trouble, not an object's
            raise Unavailable(f"{verb} {self.kind.plural}: {err}") from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"Kubernetes API unreachable ({verb}): {err}") from err
        finally:
            _done(response)

    def _json(
        self, verb: str, method: Callable[..., Any], *args: Any, namespace_: str = "", **kw: Any
    ) -> dict[str, Any]:
        response = self._stream(
            verb, method, *args, namespace_=namespace_, resource=method.__name__, **kw
        )
        return cast(dict[str, Any], json.loads(response.data or b"{}"))


def _done(response: Any) -> None:
    """Close a response that may be unread (its connection is not reused) and free it."""
    response.close()
    response.release_conn()


def _watch_events(
    response: Any, bounds: Bounds, marks: tuple[str, ...]
) -> Iterator[tuple[str, Decoded]]:
    """Each line of a watch decoded alone (``ValueError``: not an event, the stream broken:
    list again)."""
    for line in _lines(response):
        yield objects.watch_event(line, bounds, marks)


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed response as they arrive (a watch: one event a line); a long
    line is searched once, never again from its start for each chunk."""
    pending = bytearray()
    for chunk in response.stream(None, decode_content=False):
        searched = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", searched)) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            searched = 0
            if line.strip():
                yield line
    if pending.strip():
        yield bytes(pending)
