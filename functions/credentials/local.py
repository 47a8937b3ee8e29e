"""The local credential provider: a directory (``CREDENTIALS_DIR``).

``((name))`` is the file ``<dir>/<name>``, ``((name.field))`` the file ``<dir>/<name>/<field>``,
without one trailing newline. With a ``build.team``, ``<dir>/<team>/…`` is tried first.
"""

from __future__ import annotations

import re
from pathlib import Path

from functions.credentials.interpolate import Reference
from functions.errors import InvalidRequest, Unavailable
from functions.model import Build

# A team name used as a directory: no separators, no dot-only names.
TEAM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")


class CredentialsDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def lookup(self, ref: Reference, build: Build) -> str | None:
        if not self.root.is_dir():
            raise Unavailable(f"credentials: CREDENTIALS_DIR {self.root} is not a directory")
        parts = [ref.name, *([ref.field] if ref.field else [])]
        scopes = []
        if build.team:
            if not TEAM.match(build.team):
                raise InvalidRequest(
                    "build.team cannot name a credential scope (letters, digits, '_', '-', '.')"
                )
            scopes.append(self.root / build.team)
        scopes.append(self.root)
        for scope in scopes:
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
