"""Leader election on a ``coordination.k8s.io`` Lease, as Kubernetes controllers elect theirs:
one replica of the controller reconciles (the leader, which holds the Lease and renews it);
the others wait, serving replies meanwhile, and take the Lease over once it has not been
renewed for ``lease_seconds``. A leader that cannot renew in time stops leading (the caller
exits, and the Deployment starts it again as a follower), so two never lead at once for long.
Every write is guarded by the Lease's resourceVersion.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.errors import Conflict, Unavailable
from functions.kube.tekton_api import TektonApi
from functions.periodic import Periodic

log = logging.getLogger("functions.tekton")
TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # a MicroTime


class LeaderElection:
    def __init__(
        self,
        api: TektonApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_seconds = lease_seconds, renew_seconds
        self._clock = clock

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until this replica leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if self.try_lead():
                log.info("leading: %s holds Lease %s/%s", self.identity, self.namespace, self.name)
                return True
            stop.wait(self.renew_seconds)
        return False

    def keep(self, stop: threading.Event, lost: Callable[[], None]) -> Periodic:
        """Renew the Lease every ``renew_seconds`` in a thread; ``lost()`` once it could not
        be renewed before another replica could take it."""

        renewed = [time.monotonic()]

        def renew() -> bool:
            if self.try_lead():
                renewed[0] = time.monotonic()
            elif time.monotonic() - renewed[0] > self.lease_seconds - self.renew_seconds:
                log.error("lost Lease %s/%s: stopping", self.namespace, self.name)
                lost()
                return False
            return True

        return Periodic("tekton-lease", self.renew_seconds, renew, stopped=stop).start()

    def try_lead(self) -> bool:
        """Take or renew the Lease if it is this replica's or free (expired); whether it leads."""
        try:
            lease = self._api.read_lease(self.namespace, self.name)
            now = self._clock()
            if lease is not None and not self._ours_or_free(lease, now):
                return False
            self._api.write_lease(self.namespace, self._held(lease, now), lease is None)
            return True
        except (Conflict, Unavailable) as err:  # another replica was faster, or the API away
            log.info("Lease %s/%s not taken: %s", self.namespace, self.name, err)
            return False

    def _ours_or_free(self, lease: dict[str, Any], now: datetime) -> bool:
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") in (None, "", self.identity):
            return True
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        if not renewed:
            return True
        seconds = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return parse(renewed) + timedelta(seconds=seconds) < now

    def _held(self, lease: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        taken = spec.get("holderIdentity") != self.identity
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_seconds),
            renewTime=now.strftime(TIME),
        )
        if taken:
            spec["acquireTime"] = now.strftime(TIME)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        metadata = (lease or {}).get("metadata") or {"name": self.name, "namespace": self.namespace}
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }


def parse(stamp: str) -> datetime:
    """A Lease's MicroTime (or a plain RFC 3339 time)."""
    text = stamp.rstrip("Z")
    pattern = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return datetime.strptime(text, pattern).replace(tzinfo=UTC)
