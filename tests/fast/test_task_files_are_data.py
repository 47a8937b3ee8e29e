"""What the resource step leaves in the shared build volume is data: ``collect`` (which holds
the store's credentials) never follows a link there, never blocks on a FIFO and reads a
bounded amount of any file. Each case ends in a clean failure naming the file, and the
secret that a followed link would have read (here: this process's environment, standing for
collect's) is nowhere: not in the result, the log, or any other stored object.

Run in-process against a file store; ``tests/servers/test_pod_steps_in_containers.py`` runs the
same cases with the real collect container under Podman.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from functions import keys
from functions.steps.pod_contract import CollectStep
from functions.task import in_pod
from functions.task.step_settings import StepSettings
from storage import get_json, open_store

ENV_CANARY = "store-secret-0b1c3e-do-not-leak"
RUN = "5" * 32
TEN_GIB = 10 * 1024**3


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir()
    return tmp_path / "store"


@pytest.fixture
def build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build volume as the resource step leaves it after a successful check."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_CANARY)  # what /proc/self/environ holds
    task = tmp_path / "build/.task"
    task.mkdir(parents=True)
    (task / "exit-code").write_text("0\n")
    (task / "stdout").write_text('[{"ref": "1"}]')
    (task / "stderr").write_text("checked\n")
    (tmp_path / "stdin").write_text(json.dumps({"source": {"uri": "https://example.com/r"}}))
    return tmp_path / "build"


def collect(build: Path, store_dir: Path, action: str = "check") -> dict[str, Any]:
    """Run collect in a thread (a blocked read must fail the test, not hang it); the result."""
    step = CollectStep(
        run_id=RUN,
        action=action,  # type: ignore[arg-type]
        build_dir=str(build),
        stdin_file=str(build.parent / "stdin"),
        cache_key="c" * 64 if action == "get" else None,
    )
    settings = StepSettings(store_url=f"file://{store_dir}")
    statuses: list[int] = []
    worker = threading.Thread(target=lambda: statuses.append(in_pod.collect_main(step, settings)))
    worker.daemon = True
    worker.start()
    worker.join(30)
    assert statuses == [0], "collect blocked or failed"
    return get_json(open_store(f"file://{store_dir}"), keys.result_key(RUN))


def assert_stored_nowhere(store_dir: Path, secret: str) -> None:
    for path in store_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def replace_with(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "link":
        path.symlink_to("/proc/self/environ")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as sparse:
            sparse.truncate(TEN_GIB)


@pytest.mark.parametrize("name", ["stderr", "stdout", "exit-code", "timed-out", "stage-error"])
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_task_file_that_is_a_link_or_a_fifo_is_a_runtime_failure_naming_it(
    build: Path, store_dir: Path, name: str, kind: str
) -> None:
    replace_with(build / ".task" / name, kind)

    error = collect(build, store_dir)["error"]

    assert error["kind"] == "runtime"
    assert name in error["message"]
    assert ("symbolic link" if kind == "link" else "FIFO") in error["message"]
    assert_stored_nowhere(store_dir, ENV_CANARY)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("stderr", None),  # only the tail is read: the check succeeds with a bounded log
        ("stdout", "invalid_output"),  # its head is NUL bytes, not JSON
        ("stage-error", "storage"),  # a stage error (of NUL bytes): the script never ran
    ],
)
def test_a_sparse_file_of_10_gib_is_read_only_as_far_as_the_limits(
    build: Path, store_dir: Path, name: str, expected: str | None
) -> None:
    replace_with(build / ".task" / name, "sparse")

    result = collect(build, store_dir)

    assert result.get("error", {}).get("kind") == expected
    log = (store_dir / keys.log_key(RUN)).read_bytes()
    assert len(log) <= 5 * 1024 * 1024


def test_a_task_directory_that_is_a_link_is_never_followed(build: Path, store_dir: Path) -> None:
    elsewhere = build.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stderr").write_text(ENV_CANARY)
    (elsewhere / "exit-code").write_text("0")
    (elsewhere / "stdout").write_text("[]")
    for file in (build / ".task").iterdir():
        file.unlink()
    (build / ".task").rmdir()
    (build / ".task").symlink_to(elsewhere)

    error = collect(build, store_dir)["error"]

    assert error["kind"] == "runtime" and ".task is a symbolic link" in error["message"]
    assert_stored_nowhere(store_dir, ENV_CANARY)


def test_a_get_output_directory_that_is_a_link_is_not_packed(
    build: Path, store_dir: Path, tmp_path: Path
) -> None:
    (build / ".task/stdout").write_text('{"version": {"ref": "1"}}')
    secrets = tmp_path / "mounted-store-secret"
    secrets.mkdir()
    (secrets / "AWS_SECRET_ACCESS_KEY").write_text(ENV_CANARY)
    (build / "get").symlink_to(secrets)

    error = collect(build, store_dir, "get")["error"]

    assert error["kind"] == "invalid_output" and "symbolic link" in error["message"]
    assert not list(store_dir.glob("artifacts/*"))
    assert_stored_nowhere(store_dir, ENV_CANARY)
