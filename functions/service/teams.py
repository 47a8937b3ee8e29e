"""Teams bound to senders: which teams a sender may name in ``build.team``.

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

from functions.errors import InvalidRequest, TeamNotAllowed
from functions.keys import ANONYMOUS
from functions.replies import TEAM_ATTRIBUTE

Rules = tuple[tuple[str, tuple[str, ...]], ...]  # Settings.sender_teams


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
    if sender == ANONYMOUS or not allows(rules, sender, team):
        raise TeamNotAllowed(f"sender {sender!r} may not name team {team!r} here (SENDER_TEAMS)")
