"""The Kubernetes API as the runtime uses it: plain dicts in one namespace, errors translated
(with ``custom_objects`` and ``tekton_api``, the only modules that import ``kubernetes``).

Every call goes through ``KubeApi._call``, which maps errors: 401/403 and 5xx, 429 or an
unreachable API raise ``Unavailable`` (HTTP 503: Knative redelivers); 404, 409 and 410 are
``NotFound``/``Conflict``/``Gone``; any other 4xx is ``Rejected``. ``watch_pods`` streams pod
events until the watch expires; ``belongs`` tells a Job's pods from others of the same name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from functions.errors import (
    ConfigError,
    Conflict,
    Gone,
    NotFound,
    QuotaExceeded,
    Rejected,
    Unavailable,
)
from storage.store_errors import retryable_status

JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
CONTROLLER_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
__all__ = ["Conflict", "Gone", "KubeApi", "NotFound", "Rejected", "translate"]


class KubeApi:
    """The runtime's Kubernetes calls, in one namespace, as plain dicts."""

    def __init__(self, api_client: Any, namespace: str, timeout: tuple[float, float]) -> None:
        self._batch = client.BatchV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._auth = client.AuthenticationV1Api(api_client)
        self._client = api_client
        self.namespace = namespace
        self._timeout = timeout

    def close(self) -> None:
        self._client.close()

    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._json("create", "jobs", self._batch.create_namespaced_job, body=manifest)

    def read_job(self, name: str) -> dict[str, Any] | None:
        try:
            return self._json("get", "jobs", self._batch.read_namespaced_job, name)
        except NotFound:
            return None

    def delete_job(self, name: str) -> None:
        try:
            self._json(
                "delete",
                "jobs",
                self._batch.delete_namespaced_job,
                name,
                propagation_policy="Background",
            )
        except NotFound:
            pass

    def create_secret(self, manifest: dict[str, Any]) -> None:
        self._json("create", "secrets", self._core.create_namespaced_secret, body=manifest)

    def read_secret(self, name: str) -> dict[str, Any] | None:
        try:
            return self._json("get", "secrets", self._core.read_namespaced_secret, name)
        except NotFound:
            return None

    def read_secret_in(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret of another namespace (credentials): one ``get``, never a list."""
        try:
            response = self._call(
                "get",
                "secrets",
                self._core.read_namespaced_secret,
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self._timeout,
                namespace_=namespace,
            )
        except NotFound:
            return None
        return cast(dict[str, Any], json.loads(response.data or b"{}"))

    def review_token(self, token: str, audience: str) -> str | None:
        """The user a bearer token authenticates as for ``audience`` (a TokenReview: the API
        server checks signature, expiry, audience and that its ServiceAccount still exists),
        or None when it does not."""
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        response = self._call(
            "create",
            "tokenreviews",
            self._auth.create_token_review,
            body=review,
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        status = json.loads(response.data or b"{}").get("status", {})
        if not status.get("authenticated") or audience not in status.get("audiences", []):
            return None
        username = status.get("user", {}).get("username")
        return username if isinstance(username, str) and username else None

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """The labels of Namespace ``name``, or None when there is no such namespace."""
        try:
            response = self._call(
                "get",
                "namespaces",
                self._core.read_namespace,
                name,
                namespace_=name,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except NotFound:
            return None
        labels = (json.loads(response.data or b"{}").get("metadata") or {}).get("labels")
        return {str(k): str(v) for k, v in (labels or {}).items()}

    def delete_secret(self, name: str) -> None:
        try:
            self._json("delete", "secrets", self._core.delete_namespaced_secret, name)
        except NotFound:
            pass

    def answers(self) -> None:
        """One cheap call the runtime's account may make (a page of one Job): ``Unavailable``
        if the API does not answer it."""
        self._json("list", "jobs", self._batch.list_namespaced_job, limit=1)

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._json("create", "pods", self._core.create_namespaced_pod, body=manifest)

    def read_pod(self, name: str) -> dict[str, Any] | None:
        try:
            return self._json("get", "pods", self._core.read_namespaced_pod, name)
        except NotFound:
            return None

    def delete_pod(self, name: str, grace_seconds: int = 0) -> None:
        """Delete a pod now (grace 0: its processes are killed at once)."""
        try:
            self._json(
                "delete",
                "pods",
                self._core.delete_namespaced_pod,
                name,
                grace_period_seconds=grace_seconds,
            )
        except NotFound:
            pass

    def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """The pods of the namespace with labels ``selector``, and the list's
        resourceVersion to watch from."""
        body = self._json("list", "pods", self._core.list_namespaced_pod, label_selector=selector)
        return list(body.get("items") or []), (body.get("metadata") or {}).get(
            "resourceVersion"
        ) or ""

    def watch_pods(
        self, selector: str, version: str, seconds: float
    ) -> Generator[dict[str, Any], None, None]:
        """Events of the pods with labels ``selector`` until the watch expires (the server's
        timeout, or no data for a while longer: then it just ends). Raises ``Gone`` when
        ``version`` is too old."""
        response = self._call(
            "watch",
            "pods",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version or None,
            timeout_seconds=max(1, int(seconds)),
            _preload_content=False,
            _request_timeout=(self._timeout[0], seconds + min(5, seconds)),
        )
        try:
            for line in response:  # urllib3 splits the stream into lines
                if not line.endswith(b"\n"):
                    return  # cut inside an event: the caller lists again
                if line.strip():
                    yield self._event(json.loads(line))
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
            return  # expired or cut: the caller lists again, which tells a dead API apart
        finally:
            response.close()  # a half-read stream cannot go back to the pool
            response.release_conn()

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("type") != "ERROR":
            return event
        status = event.get("object") or {}
        if status.get("code") == 410:
            raise Gone(status.get("message"))
        raise Unavailable(
            f"Kubernetes API: watch pods failed: {status.get('code')} "
            f"{status.get('reason')}: {status.get('message')}"
        )

    def _json(
        self, verb: str, resource: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        response = self._call(
            verb,
            resource,
            method,
            *args,
            self.namespace,
            **kwargs,
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        return cast(dict[str, Any], json.loads(response.data or b"{}"))

    def _call(
        self,
        verb: str,
        resource: str,
        method: Callable[..., Any],
        *args: Any,
        namespace_: str = "",
        **kwargs: Any,
    ) -> Any:
        """THE request path: every call, its errors translated (``raise … from``)."""
        try:
            return method(*args, **kwargs)
        except ApiException as err:
            raise translate(err, verb, resource, namespace_ or self.namespace) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"Kubernetes API unreachable ({verb} {resource}): {err}") from err


def translate(err: ApiException, verb: str, resource: str, namespace: str) -> Exception:
    """The runtime's exception for an API error answer."""
    status, message = err.status or 0, _api_message(err)
    if status == 404:
        return NotFound(message)
    if status == 409:
        return Conflict(message)
    if status == 410:
        return Gone(message)
    if status == 403 and "exceeded quota" in message:
        return QuotaExceeded(
            f"the ResourceQuota of namespace {namespace!r} has no room for '{verb} {resource}' "
            f"now: {message}"
        )
    if status in (401, 403):
        return Unavailable(
            f"Kubernetes refused '{verb} {resource}' in namespace {namespace!r} ({status}: "
            f"{message}): the function's service account needs that verb (knative/rbac.yaml)"
        )
    if retryable_status(status):
        return Unavailable(f"Kubernetes API: {verb} {resource}: {status or ''} {message}")
    return Rejected(f"Kubernetes rejected '{verb} {resource}' ({status}): {message}")


def _api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.reason or "no message")


def belongs(pod: dict[str, Any], job: str, uid: str = "") -> bool:
    """Whether ``pod`` is one of Job ``job``'s, checked client-side: some API servers (and
    kmock) ignore label selectors. With ``uid``, pods of an earlier Job of the same name
    (deleted, its pods not yet collected) do not count."""
    metadata = pod.get("metadata") or {}
    pod_labels = metadata.get("labels") or {}
    if not any(pod_labels.get(label) == job for label in JOB_NAME_LABELS):
        return False
    owners = owner_uids(pod) | {
        pod_labels[label] for label in CONTROLLER_UID_LABELS if label in pod_labels
    }
    return not uid or not owners or uid in owners


def uid_of(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def owner_uids(obj: dict[str, Any]) -> set[str]:
    references = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(ref.get("uid")) for ref in references if ref.get("uid")}


def api_client_from_env(kubeconfig: str = "") -> Any:
    """An ApiClient from the in-cluster service account, else from KUBECONFIG."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            config.load_kube_config(
                config_file=kubeconfig or None, client_configuration=configuration
            )
        except (config.ConfigException, OSError) as err:
            raise ConfigError(
                "RUNTIME=kubernetes needs the API: run in a cluster (service account) or set "
                f"KUBECONFIG ({err})"
            ) from err
    return client.ApiClient(configuration)
