"""The package's declared dependencies and the image's pinned requirements name the same
distributions, and each pin satisfies its declared range: ``pip install .`` and the image get
the same libraries."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def pinned() -> dict[str, str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {req.name.lower(): str(next(iter(req.specifier)).version) for req in reqs}


def test_declared_dependencies_are_the_pinned_requirements_and_admit_the_pins() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {Requirement(d).name.lower(): Requirement(d) for d in project["dependencies"]}
    pins = pinned()
    assert set(declared) == set(pins)
    for name, requirement in declared.items():
        assert requirement.specifier.contains(pins[name]), (name, pins[name])


def test_the_console_script_is_the_cli() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    from functions.cli import commands

    assert project["scripts"]["resource-functions"] == "functions.cli.commands:console"
    assert callable(commands.console)
