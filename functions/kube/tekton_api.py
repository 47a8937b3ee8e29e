"""The Kubernetes API as the Tekton controller uses it: CustomRuns (``custom_objects``: list,
watch, get, status, Events on them) and its leader Lease.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client

from functions.errors import NotFound
from functions.kube.custom_objects import PAGE, CustomObjects, Kind
from functions.kube.objects import Bounds, Decoded, ListEnd

# What says whose a CustomRun is, read even from one that cannot be decoded.
OWNER_MARKS = ("spec.customRef.apiVersion", "spec.customSpec.apiVersion")
DONE_MARK = "status.completionTime"  # set once a CustomRun has ended
CUSTOMRUNS = Kind(
    "tekton.dev",
    "v1beta1",
    "customruns",
    "CustomRun",
    bounds=Bounds(),  # a CustomRun of ours is far smaller and shallower (params.py)
    marks=(*OWNER_MARKS, DONE_MARK),  # what an undecodable one still tells
    component="resource-functions-tekton-controller",
)


class TektonApi(CustomObjects):
    def __init__(
        self,
        api_client: Any,
        timeout: tuple[float, float] = (5.0, 30.0),
        counted: Callable[[], None] = lambda: None,
        page: int = PAGE,
    ) -> None:
        super().__init__(api_client, CUSTOMRUNS, timeout, counted, page)
        self._leases = client.CoordinationV1Api(api_client)

    def list_customruns(self) -> Iterator[Decoded | ListEnd]:
        return self.list()

    def watch_customruns(
        self, resource_version: str, seconds: int
    ) -> Iterator[tuple[str, Decoded]]:
        return self.watch(resource_version, seconds)

    def read_customrun(self, namespace: str, name: str) -> Decoded | None:
        return self.read(namespace, name)

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
