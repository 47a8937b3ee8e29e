"""requirements-local.txt (what `.ci/setup` installs for the demo) is a part of the services'
requirements.txt, pinned by constraints.txt like the rest."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def names(path: Path) -> set[str]:
    """The distribution names a requirements file lists (normalised), its includes left out."""
    found = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            found.add(re.split(r"[\[=<>~! ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return found


def test_the_local_requirements_are_among_the_services_and_pinned() -> None:
    local = names(REPO / "requirements-local.txt")
    assert local, "requirements-local.txt lists nothing"
    assert local <= names(REPO / "requirements.txt")
    assert local <= names(REPO / "constraints.txt")
    lines = (REPO / "requirements-local.txt").read_text().splitlines()
    pinned_here = [line for line in lines if "=" in line.split("#", 1)[0]]
    assert pinned_here == [], "versions belong in constraints.txt only"
