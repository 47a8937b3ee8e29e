"""The Kubernetes API as the Tekton controller uses it: CustomRuns (list, watch, get, status),
Events on them, and its leader Lease; plain dicts, errors translated as the runtime's are
(``api.translate``: 404/409 ``NotFound``/``Conflict``, 401/403/5xx/unreachable
``Unavailable``). Every call has a timeout; a watch ends when its server-side timeout does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, cast

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from functions.errors import NotFound, Unavailable
from functions.kube.api import translate

GROUP, VERSION, PLURAL = "tekton.dev", "v1beta1", "customruns"
COMPONENT = "resource-functions-tekton-controller"  # an Event's reporting controller


class TektonApi:
    def __init__(
        self,
        api_client: Any,
        timeout: tuple[float, float] = (5.0, 30.0),
        counted: Callable[[], None] = lambda: None,
    ) -> None:
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._leases = client.CoordinationV1Api(api_client)
        self._timeout = timeout
        self._counted = counted  # called once per API request (the controller's metric)

    # --- CustomRuns -------------------------------------------------------------------------

    def list_customruns(self) -> tuple[list[dict[str, Any]], str]:
        """Every CustomRun of the cluster, and the list's resourceVersion (to watch from)."""
        listed = self._json(
            "list", self._objects.list_cluster_custom_object, GROUP, VERSION, PLURAL
        )
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        return list(listed.get("items") or []), version

    def watch_customruns(
        self, resource_version: str, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` of each change after ``resource_version`` for ``seconds``;
        ``ERROR`` (410 Gone and friends) means: list again."""
        self._counted()
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self._objects.list_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _request_timeout=(self._timeout[0], seconds + 30),
            ):
                kind, obj = event.get("type"), event.get("object")
                if isinstance(kind, str) and isinstance(obj, dict):
                    yield kind, obj
        except ApiException as err:
            raise translate(err, "watch", PLURAL, "") from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"Kubernetes API unreachable (watch {PLURAL}): {err}") from err
        finally:
            stream.stop()

    def read_customrun(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                "get",
                self._objects.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                namespace_=namespace,
            )
        except NotFound:
            return None

    def replace_status(self, run: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write ``status`` over ``run``'s, guarded by its resourceVersion (``Conflict`` when it
        changed meanwhile, ``NotFound`` when it is gone); the object as written."""
        meta = run["metadata"]
        return self._json(
            "update",
            self._objects.replace_namespaced_custom_object_status,
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {**run, "status": status},
            namespace_=meta["namespace"],
        )

    # --- Events -------------------------------------------------------------------------------

    def event(self, run: dict[str, Any], warning: bool, reason: str, message: str) -> None:
        """A Kubernetes Event on ``run`` (``kubectl describe customrun`` shows it)."""
        meta = run["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": run.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": "CustomRun",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": "Warning" if warning else "Normal",
            "reason": reason[:128],
            "message": message[:1024],
            "source": {"component": COMPONENT},
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

    # --- the leader Lease ----------------------------------------------------------------------

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                "get",
                self._leases.read_namespaced_lease,
                name,
                namespace,
                namespace_=namespace,
            )
        except NotFound:
            return None

    def write_lease(self, namespace: str, lease: dict[str, Any], create: bool) -> dict[str, Any]:
        """Create ``lease``, or replace it guarded by its resourceVersion (``Conflict``)."""
        if create:
            return self._json(
                "create",
                self._leases.create_namespaced_lease,
                namespace,
                lease,
                namespace_=namespace,
            )
        return self._json(
            "update",
            self._leases.replace_namespaced_lease,
            lease["metadata"]["name"],
            namespace,
            lease,
            namespace_=namespace,
        )

    # --- the one request path ------------------------------------------------------------------

    def _json(
        self, verb: str, method: Callable[..., Any], *args: Any, namespace_: str = "", **kw: Any
    ) -> dict[str, Any]:
        self._counted()
        try:
            response = method(*args, **kw, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as err:
            raise translate(err, verb, method.__name__, namespace_) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"Kubernetes API unreachable ({verb}): {err}") from err
        return cast(dict[str, Any], json.loads(response.data or b"{}"))
