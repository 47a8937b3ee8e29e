"""Who may deliver events: with ``SENDER_AUDIENCE`` set, every request must carry a Kubernetes
bearer token issued for that audience (Knative Eventing sends one to a Trigger subscriber that
names an ``audience``, once its ``authentication-oidc`` feature is on), for an identity that
matches ``ALLOWED_SENDERS``.

Knative Serving 1.22 does not enforce EventPolicies for a Knative Service, so the function checks
the token itself, through the API server's TokenReview (signature, expiry, audience, and that
the ServiceAccount still exists). A decision is kept for a minute per token, so a busy Trigger
costs one review a minute, not one per event; a refusal for ``REFUSED_SECONDS``, so a sender
repeating a bad token costs one review, not one per request.
"""

from __future__ import annotations

import fnmatch
import hashlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from functions.bounded_cache import BoundedCache
from functions.errors import NotAuthenticated, SenderNotAllowed

if TYPE_CHECKING:
    from functions.settings import Settings

Review = Callable[[str, str], "str | None"]  # (token, audience) -> username or None
REMEMBER_SECONDS = 60.0
REFUSED_SECONDS = 10.0
REMEMBER_AT_MOST = 1024


class SenderCheck:
    def __init__(
        self,
        review: Review,
        audience: str,
        allowed: tuple[str, ...],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self.audience = audience
        self.allowed = allowed
        self._clock = clock
        # sha256(token) -> (user, until); refusals apart, so a flood of bad tokens never
        # pushes a sender's good one out
        self._known: BoundedCache[str, tuple[str, float]] = BoundedCache(REMEMBER_AT_MOST)
        self._refused: BoundedCache[str, float] = BoundedCache(REMEMBER_AT_MOST)

    def sender(self, authorization: str | None) -> str:
        """The identity behind an ``Authorization`` header. Raises ``NotAuthenticated`` (no
        or invalid token), ``SenderNotAllowed``, or ``Unavailable`` (API unreachable)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthenticated(
                f"this service takes events only with a bearer token for audience "
                f"{self.audience!r} (SENDER_AUDIENCE)"
            )
        user = self._user(token.strip())
        if user is None:
            raise NotAuthenticated(f"the bearer token is not valid for audience {self.audience!r}")
        if not any(fnmatch.fnmatchcase(user, pattern) for pattern in self.allowed):
            raise SenderNotAllowed(f"sender {user!r} is not allowed here (ALLOWED_SENDERS)")
        return user

    def _user(self, token: str) -> str | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        known = self._known.get(key)
        if known is not None and known[1] > now:
            return known[0]
        refused = self._refused.get(key)
        if refused is not None and refused > now:
            return None
        user = self._review(token, self.audience)
        if user is None:
            self._refused.put(key, now + REFUSED_SECONDS)
        else:
            self._known.put(key, (user, now + REMEMBER_SECONDS))
        return user


def sender_check_from(settings: Settings) -> SenderCheck | None:
    """The check the settings ask for, or None without ``SENDER_AUDIENCE``."""
    if not settings.sender_audience:
        return None
    from functions.kube.api import KubeApi, api_client_from_env

    api = KubeApi(api_client_from_env(settings.kubeconfig), "", (5.0, 10.0))
    return SenderCheck(api.review_token, settings.sender_audience, settings.allowed_senders)
