"""The local credential provider: a directory (``CREDENTIALS_DIR``) with two separate roots.

    <dir>/shared/<name>            values every request may use
    <dir>/shared/<name>/<field>
    <dir>/teams/<team>/<name>      values of one team, tried first by its requests
    <dir>/teams/<team>/<name>/<field>

``((name))`` is the file ``<name>``, ``((name.field))`` the file ``<name>/<field>``, without
one trailing newline. Team folders live under ``teams/`` and shared values under ``shared/``,
so no name (names and fields hold no ``/`` or ``.``) can ever address another team's folder:
``((blue.token))`` is ``shared/blue/token``, never ``teams/blue/token``. A request without
``build.team`` reads ``shared/`` alone.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from functions.credentials.interpolate import Reference
from functions.errors import InvalidRequest, Unavailable
from functions.model import Build

SHARED = "shared"
TEAMS = "teams"
# A team name used as a directory: no separators, no dot-only names.
TEAM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
log = logging.getLogger("functions.credentials")


class CredentialsDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if self.root.is_dir() and not any((self.root / d).is_dir() for d in (SHARED, TEAMS)):
            log.warning(
                "CREDENTIALS_DIR has neither shared/ nor teams/: no value will resolve "
                "(the layout is <dir>/shared/<name> and <dir>/teams/<team>/<name>)"
            )

    def scopes(self, build: Build) -> list[Path]:
        """Where a request's references are looked up, in order: its team's folder, then
        the shared one. ``InvalidRequest`` if the team cannot name a folder."""
        if not build.team:
            return [self.root / SHARED]
        if not TEAM.match(build.team):
            raise InvalidRequest(
                "build.team cannot name a credential scope (letters, digits, '_', '-', '.')"
            )
        return [self.root / TEAMS / build.team, self.root / SHARED]

    def lookup(self, ref: Reference, build: Build) -> str | None:
        if not self.root.is_dir():
            raise Unavailable(f"credentials: CREDENTIALS_DIR {self.root} is not a directory")
        parts = [ref.name, *([ref.field] if ref.field else [])]
        for scope in self.scopes(build):
            path = scope.joinpath(*parts)
            try:
                text = path.read_text(encoding="utf-8")
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except UnicodeDecodeError:
                raise InvalidRequest(f"{ref}: the credential is not UTF-8 text") from None
            except OSError as err:
                raise Unavailable(f"credentials: cannot read {ref}: {err.strerror}") from err
            return text.removesuffix("\n")
        return None
