"""Which teams an artifact belongs to (``storage.artifacts.teams_of``): the teams whose gets
produced it or were answered with it. A get records its team before it runs or answers (so an
asynchronous get's artifact belongs to its team before it exists); a put whose input belongs
to another team is refused (403) before anything starts, naming the input. An artifact that no
get recorded (an upload by other means that recorded none) belongs to no team.

The record is read and written once per (artifact, team) and replica: the replica remembers
what it recorded (bounded), so a hot get costs no store request for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from functions import keys
from functions.bounded_cache import BoundedCache
from functions.errors import InputNotAllowed
from functions.model import ArtifactRef
from storage import Store
from storage.artifacts import add_team, teams_of

CAPACITY = 4096  # (cache key, team) pairs remembered per replica


class ArtifactTeams:
    def __init__(self, store: Store, capacity: int = CAPACITY) -> None:
        self.store = store
        self._recorded: BoundedCache[tuple[str, str], bool] = BoundedCache(capacity)

    def recorded(self, cache_key: str, team: str) -> bool:
        """Whether this replica recorded ``team`` for the get artifact ``cache_key``."""
        return self._recorded.get((cache_key, team)) is not None

    def record(self, cache_key: str, team: str) -> None:
        """Record ``team`` for the artifact of the get ``cache_key`` (a store update unless
        this replica recorded it already)."""
        if self.recorded(cache_key, team):
            return
        add_team(self.store, keys.artifact_key(cache_key, ""), team)
        self._recorded.put((cache_key, team), True)


def check_inputs(store: Store, inputs: Mapping[str, ArtifactRef], team: str) -> None:
    """Raise ``InputNotAllowed`` naming each input that is not an artifact of ``team``."""
    refused = sorted(name for name, ref in inputs.items() if team not in teams_of(store, ref.key))
    if refused:
        who = f"team {team!r}" if team else "requests naming no team"
        raise InputNotAllowed(
            f"input(s) {', '.join(repr(n) for n in refused)}: not an artifact of {who} "
            "(a put takes the artifacts of its own team's gets)"
        )
