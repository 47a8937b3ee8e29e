"""Which team a namespace serves, by an administrator's word only (Tekton's tenancy is the
namespace): the team of a CustomRun, and of a Task that fetches or hands over artifacts.

A namespace serves a team when the Namespace object carries the label
``resource-functions.dev/team`` (its value: the team), and, where ``TEKTON_TEAMS`` is set (a
JSON object namespace → team), when it also names the namespace, with the same team: the label
is always needed, since it is what the pipeline fence (the tekton component's NetworkPolicy)
selects, so a namespace served is a namespace fenced.
Neither is a tenant's to set: ``TEKTON_TEAMS`` is the platform's ConfigMap, and a Namespace
is cluster-scoped (a namespace's own admins may not label it; the shipped
ValidatingAdmissionPolicy keeps the label to the team administrators even from whoever may
create namespaces). A namespace's name alone never makes it a team.

The controller and the artifacts service both ask here, so a namespace is the same team to
both. A label is read through the API and remembered ``REMEMBER_SECONDS``, so a label taken
off stops serving within that time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from functions.bounded_cache import BoundedCache

TEAM_LABEL = "resource-functions.dev/team"
REMEMBER_SECONDS = 30.0
REMEMBER_AT_MOST = 1024
TEAM_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# namespace -> its labels, None when there is no such namespace (raises ``Unavailable`` when
# the API cannot say)
LabelsOf = Callable[[str], "Mapping[str, str] | None"]


class NamespaceTeams:
    def __init__(
        self,
        teams: Mapping[str, str] | None,
        labels_of: LabelsOf | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._teams = dict(teams) if teams is not None else None
        self._labels_of = labels_of
        self._clock = clock
        self._known: BoundedCache[str, tuple[str | None, float]] = BoundedCache(REMEMBER_AT_MOST)

    def team_of(self, namespace: str) -> str | None:
        """The team ``namespace`` serves, or None (``refusal`` says why)."""
        if self._teams is not None and namespace not in self._teams:
            return None
        labelled = self._labelled(namespace)
        if self._teams is not None and labelled != self._teams[namespace]:
            return None
        return labelled

    def _labelled(self, namespace: str) -> str | None:
        """The team the namespace's label names (read through the API, remembered)."""
        if self._labels_of is None:
            return None
        now = self._clock()
        known = self._known.get(namespace)
        if known is not None and known[1] > now:
            return known[0]
        team = team_label(self._labels_of(namespace))
        self._known.put(namespace, (team, now + REMEMBER_SECONDS))
        return team

    def refusal(self, namespace: str) -> str:
        """Why ``namespace`` serves no team, for a CustomRun's message or a 403."""
        if self._teams is not None and namespace not in self._teams:
            return f"namespace {namespace!r} is not served: TEKTON_TEAMS does not name it"
        team = self._teams[namespace] if self._teams is not None else "TEAM"
        also = (
            ", the team TEKTON_TEAMS names for it"
            if self._teams is not None
            else ", and TEKTON_TEAMS is empty"
        )
        return (
            f"namespace {namespace!r} is not served: it has no valid {TEAM_LABEL} label{also} "
            f"(a team administrator sets it: kubectl label namespace {namespace} "
            f"{TEAM_LABEL}={team})"
        )


def team_label(labels: Mapping[str, str] | None) -> str | None:
    """The team a namespace's labels name, or None (no label, or not a team name)."""
    value = (labels or {}).get(TEAM_LABEL)
    return value if isinstance(value, str) and TEAM_NAME.fullmatch(value) else None
