"""A request's team (``build.team``) and what bounds it: which teams a sender may name
(``check_team``), how many runs a team has in flight on a replica (``TeamRuns``) and which
artifacts are a team's (``ArtifactTeams``, ``check_inputs``).

The team selects the credentials that ``((var))`` references resolve to, so a sender is
trusted only as far as the teams it may name. Every request that names a team is checked
before any lookup or run:

- The event may carry the team as its ``team`` extension attribute, which must then equal
  ``build.team`` (400). With sender authentication (``SENDER_AUDIENCE``) it must carry it:
  through a Broker the function sees only the Trigger's identity, so the team has to be an
  attribute that the Broker's EventPolicy can filter on for the original sender.
- With sender authentication, ``SENDER_TEAMS`` must allow the sender that team (403): a JSON
  object of sender identity globs to lists of team globs. The Triggers' identities map to
  ``["*"]``: the Broker's EventPolicies decide per original sender, by the attribute.
- Without sender authentication (a laptop's ``serve``) there is no identity to bind: the
  service binds 127.0.0.1 by default and says what is open when told otherwise.

A request that names no team uses shared credentials only and is not checked here.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from functions import keys
from functions.bounded_cache import BoundedCache
from functions.errors import InputNotAllowed, InvalidRequest, TeamNotAllowed, TooManyRuns
from functions.model import ArtifactRef
from functions.replies import TEAM_ATTRIBUTE
from storage import Store
from storage.artifacts import add_team, teams_of

Rules = tuple[tuple[str, tuple[str, ...]], ...]  # Settings.sender_teams
RETRY_AFTER_SECONDS = 10  # a check or get ends within seconds; the Broker's backoff adds more
CAPACITY = 4096  # (cache key, team) pairs an ArtifactTeams remembers per replica


def allows(rules: Rules, sender: str, team: str) -> bool:
    """Whether a rule of ``SENDER_TEAMS`` lets ``sender`` name ``team``."""
    return any(
        fnmatch.fnmatchcase(sender, who) and any(fnmatch.fnmatchcase(team, t) for t in globs)
        for who, globs in rules
    )


def check_team(rules: Rules, *, enforced: bool, sender: str, team: str, attribute: object) -> None:
    """Raise ``InvalidRequest`` (400) or ``TeamNotAllowed`` (403) for a request naming
    ``team`` (``build.team``) whose event carries ``attribute`` (its ``team``, or None).
    ``enforced``: sender authentication is on, so the sender is known."""
    if attribute is not None and attribute != team:
        raise InvalidRequest(
            f"the event's {TEAM_ATTRIBUTE!r} attribute ({attribute!r}) must equal "
            f"build.team ({team!r})"
        )
    if not team or not enforced:
        return
    if attribute is None:
        raise InvalidRequest(
            f"build.team {team!r} must also travel as the event's {TEAM_ATTRIBUTE!r} "
            "attribute (ce-team), which the Broker's EventPolicies filter on"
        )
    if sender == keys.ANONYMOUS or not allows(rules, sender, team):
        raise TeamNotAllowed(f"sender {sender!r} may not name team {team!r} here (SENDER_TEAMS)")


class TeamRuns:
    """Runs in flight per team on this replica (``MAX_RUNS_PER_TEAM``), so that one team's
    burst cannot take every thread, container or Job of the replica from the others.

    A run is counted from before its container or Job is created until it ends: a
    synchronous run until ``run`` returns, an asynchronous one until its runtime reports its
    end (``ended``). It is counted by run id, so a redelivery of a started run (started
    again idempotently) is not counted twice. Over the limit, ``TooManyRuns`` is answered
    429 with ``Retry-After`` before anything starts; the Broker retries it. Requests naming
    no team are one team (``""``). A runtime that never reports an end (closed, or a
    Kubernetes task it stopped following at shutdown) leaves its count until the replica
    ends, which is then."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._runs: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def take(self, team: str, run: str) -> None:
        """Count ``run`` for ``team``; ``TooManyRuns`` if the team is at its limit."""
        with self._lock:
            runs = self._runs.setdefault(team, set())
            if run not in runs and len(runs) >= self.limit:
                raise TooManyRuns(
                    f"team {team!r} has {len(runs)} runs in flight on this replica, its limit "
                    f"(MAX_RUNS_PER_TEAM); retry later",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            runs.add(run)

    def done(self, team: str, run: str) -> None:
        with self._lock:
            runs = self._runs.get(team, set())
            runs.discard(run)
            if not runs:
                self._runs.pop(team, None)

    @contextmanager
    def held(self, team: str, run: str) -> Iterator[None]:
        self.take(team, run)
        try:
            yield
        finally:
            self.done(team, run)


class ArtifactTeams:
    """Which teams an artifact belongs to (``storage.artifacts.teams_of``): the teams whose
    gets produced it or were answered with it. A get records its team before it runs or
    answers (so an asynchronous get's artifact belongs to its team before it exists); a put
    whose input belongs to another team is refused (403) before anything starts, naming the
    input (``check_inputs``). An artifact that no get recorded (an upload by other means that
    recorded none) belongs to no team.

    The record is read and written once per (artifact, team) and replica: the replica
    remembers what it recorded (bounded), so a hot get costs no store request for it."""

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
