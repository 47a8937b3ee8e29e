"""Credentials by reference: ``((name))`` and ``((name.field))`` in the strings of a request's
``source``, ``params`` and ``version``, resolved just before the run through a ``Provider``.

    class Provider(Protocol):
        def lookup(self, ref: Reference, build: Build) -> str | None   # None: not found

A provider raises ``Unavailable`` when it cannot be reached (HTTP 503, redelivered). A
reference that no provider resolves is ``InvalidRequest`` (HTTP 400) naming the variable,
never a value. Resolved values go nowhere but the stdin payload; ``Resolved.values`` lists
them so that every one is redacted; one under ``MIN_CHARS`` characters cannot be (it would
show itself in the text around it), and resolving it logs a warning naming the variable.
Providers: ``local.CredentialsDir``
(``CREDENTIALS_DIR``) and ``kubernetes.KubernetesSecrets`` (Secrets, Concourse's
conventions); ``make_provider`` picks one from the settings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from functions.credentials.interpolate import Reference, Resolved, find_references, interpolate
from functions.errors import ConfigError, InvalidRequest
from functions.logs import fields
from functions.model import Build
from functions.redaction import MIN_CHARS

if TYPE_CHECKING:
    from functions.settings import Settings

__all__ = [
    "NoProvider",
    "Provider",
    "Reference",
    "Resolved",
    "find_references",
    "interpolate",
    "make_provider",
    "resolve",
]

log = logging.getLogger("functions.credentials")


class Provider(Protocol):
    def lookup(self, ref: Reference, build: Build) -> str | None: ...


class NoProvider:
    """No credential manager configured: every reference is unresolvable."""

    hint = " (no credential provider is configured: set CREDENTIALS_PROVIDER)"

    def lookup(self, ref: Reference, build: Build) -> str | None:
        return None


def make_provider(settings: Settings) -> Provider:
    if settings.credentials_provider == "dir":
        if not settings.credentials_dir:
            raise ConfigError("CREDENTIALS_PROVIDER=dir needs CREDENTIALS_DIR")
        from functions.credentials.directory import CredentialsDir

        return CredentialsDir(settings.credentials_dir)
    if settings.credentials_provider == "kubernetes":
        from functions.credentials.namespace_secrets import KubernetesSecrets

        return KubernetesSecrets.from_settings(settings)
    return NoProvider()


def resolve(
    provider: Provider,
    build: Build,
    *,
    source: dict[str, Any],
    params: dict[str, Any],
    version: dict[str, str] | None,
) -> Resolved:
    """Every reference in source/params/version looked up and replaced. Raises
    ``InvalidRequest`` naming each variable that cannot be resolved (never a value), or the
    provider's ``Unavailable``."""
    refs = find_references(source, params, version)
    if not refs:
        return Resolved(source=source, params=params, version=version)
    found: dict[Reference, str] = {}
    missing: list[str] = []
    for ref in refs:
        value = provider.lookup(ref, build)
        if value is None:
            missing.append(f"{ref} cannot be resolved{getattr(provider, 'hint', '')}")
        else:
            found[ref] = value
    if missing:
        raise InvalidRequest(*missing)
    for ref, value in found.items():
        if 0 < len(value) < MIN_CHARS:
            log.warning(
                f"{ref} resolves to a value under {MIN_CHARS} characters, which is never "
                "redacted from logs (it would show itself): give it a longer value",
                extra=fields(variable=str(ref)),
            )
    return Resolved(
        source=interpolate(source, found),
        params=interpolate(params, found),
        version=interpolate(version, found),
        values=tuple(sorted({v for v in found.values() if v}, key=len, reverse=True)),
    )
