"""The project as a user installs it: a wheel built from the source, installed into a fresh
virtual environment (no access to the source tree), every module imported, the
``resource-functions`` command's help, and one ``run`` of the example resource on Podman.

The dependencies come from a wheelhouse of ``requirements.txt`` (pinned by
``constraints.txt``), downloaded once into ``~/.cache/resource-functions/wheels``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from functions.cli.busybox_image import build_resource_image

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def wheelhouse() -> Path:
    """The pinned dependencies as wheels, downloaded once per constraints."""
    pins = (REPO / "requirements.txt").read_bytes() + (REPO / "constraints.txt").read_bytes()
    where = Path.home() / ".cache/resource-functions/wheels" / hashlib.sha256(pins).hexdigest()[:12]
    if not (where / "done").exists():
        where.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d"]
        requirements = ["-r", str(REPO / "requirements.txt"), "-c", str(REPO / "constraints.txt")]
        subprocess.run([*pip, str(where), *requirements], check=True)
        (where / "done").touch()
    return where


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed; its bin directory."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "source"  # a copy: building must leave the checkout clean
    shutil.copytree(
        REPO / "functions", source / "functions", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        REPO / "storage", source / "storage", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    wheels = tmp / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]  # isolated: setuptools
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True)
    (wheel,) = wheels.glob("resource_functions-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    pip = [str(tmp / "venv/bin/pip"), "install", "-q", "--no-index"]
    subprocess.run([*pip, "--find-links", str(wheelhouse()), str(wheel)], check=True)
    return tmp / "venv/bin"


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DOCKER_HOST")}
    return subprocess.run(
        command,
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_module_imports_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    script = (
        "import importlib, pkgutil, functions, storage\n"
        "names = [m.name for p in (functions, storage)\n"
        "         for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "[importlib.import_module(n) for n in names]\n"
        "print(functions.__file__); print(len(names))\n"
    )
    done = run([str(installed / "python"), "-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    where, count = done.stdout.split()
    assert "site-packages" in where and not where.startswith(str(REPO))
    assert int(count) > 50


def test_the_command_helps_and_runs_the_example_resource(
    installed: Path, docker_host: str, tmp_path: Path
) -> None:
    helped = run([str(installed / "resource-functions"), "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert all(word in helped.stdout for word in ("serve", "run", "demo", "runs", "versions"))

    image = build_resource_image("localhost/hello-resource", REPO / "examples/hello-resource")
    (tmp_path / "store").mkdir()
    done = run(
        [
            str(installed / "resource-functions"),
            "run",
            "check",
            "--image",
            image,
            "--source",
            '{"latest": "2"}',
        ],
        tmp_path,
        DOCKER_HOST=docker_host,
        STORE_URL=(tmp_path / "store").as_uri(),
        CACHE_SECRET="package-test",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["versions"] == [{"n": "1"}, {"n": "2"}]
