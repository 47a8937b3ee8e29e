"""The Kubernetes credential provider: Secrets, by Concourse's Kubernetes credential manager
conventions.

``((name))`` / ``((name.field))`` is looked up in the namespace ``<prefix><team>``
(``CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX``, default ``concourse-``): first the Secret
``<pipeline>.<name>`` (when the request names a pipeline), then ``<name>``; the value is the
Secret's key ``field``, or ``value`` without one. Each lookup is one ``get`` (the functions'
ServiceAccount may not list Secrets). A request without ``build.team`` has no namespace, so its
references are unresolvable. API errors follow ``functions.kube.api``: unreachable, 401/403, 429 and 5xx
are ``Unavailable`` (503).

A prefix from which some team name reaches the task namespace (where the store Secret and every
run's stdin Secret live) or the functions' own namespace is refused at start (``ConfigError``
naming the prefix, the team and both namespaces): a request naming that team would otherwise
read those Secrets as its credentials wherever RBAC let it.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any, Protocol

from functions.credentials.interpolate import Reference
from functions.errors import ConfigError, InvalidRequest, Rejected, Unavailable
from functions.model import Build

if TYPE_CHECKING:
    from functions.settings import Settings

DEFAULT_PREFIX = "concourse-"
DEFAULT_KEY = "value"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class SecretReader(Protocol):
    def read_secret_in(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class KubernetesSecrets:
    hint = " (no Secret holds it in the team's credential namespace)"

    def __init__(
        self,
        api: SecretReader,
        prefix: str = DEFAULT_PREFIX,
        *,
        protected: dict[str, str] | None = None,
    ) -> None:
        """``protected``: the namespaces no team may reach, by role (``task``, ``functions``)."""
        check_prefix(prefix, protected or {})
        self.api = api
        self.prefix = prefix

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesSecrets:
        from functions.kube.api import KubeApi, api_client_from_env
        from functions.settings import own_namespace

        protected = {"task": settings.task_namespace, "functions": own_namespace()}
        check_prefix(settings.credentials_kubernetes_namespace_prefix, protected)
        api = KubeApi(
            api_client_from_env(settings.kubeconfig), settings.task_namespace, (5.0, 30.0)
        )
        return cls(api, settings.credentials_kubernetes_namespace_prefix, protected=protected)

    def namespace(self, build: Build) -> str | None:
        namespace = self.prefix + build.team
        return namespace if build.team and DNS_LABEL.match(namespace) else None

    def secret_names(self, ref: Reference, build: Build) -> list[str]:
        names = [f"{build.pipeline}.{ref.name}"] if build.pipeline else []
        names.append(ref.name)
        return [n for n in names if DNS_SUBDOMAIN.match(n)]

    def lookup(self, ref: Reference, build: Build) -> str | None:
        namespace = self.namespace(build)
        if namespace is None:
            return None
        key = ref.field or DEFAULT_KEY
        for name in self.secret_names(ref, build):
            try:
                secret = self.api.read_secret_in(namespace, name)
            except Rejected as err:  # not expected for a get; never retried
                raise Unavailable(f"credentials: reading Secret {name}: {err}") from err
            encoded = ((secret or {}).get("data") or {}).get(key)
            if encoded is None:
                continue
            try:
                return base64.b64decode(encoded, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                raise InvalidRequest(
                    f"{ref}: Secret {namespace}/{name} key {key!r} is not UTF-8 text"
                ) from None
        return None


def check_prefix(prefix: str, protected: dict[str, str]) -> None:
    """``ConfigError`` if a team name makes ``<prefix><team>`` one of the ``protected``
    namespaces (by role), naming the prefix, each namespace reached, its team and them all."""
    reached = [
        f"the {role} namespace {namespace!r} (team {namespace[len(prefix) :]!r})"
        for role, namespace in sorted(protected.items())
        if namespace.startswith(prefix) and len(namespace) > len(prefix)
    ]
    if reached:
        every = ", ".join(f"{role} {ns!r}" for role, ns in sorted(protected.items()))
        raise ConfigError(
            f"CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX={prefix!r} reaches "
            f"{' and '.join(reached)}: a request naming that team would read its Secrets. "
            f"Choose a prefix that no namespace of the platform ({every}) starts with."
        )
