"""``python -m functions run``: one action from the command line, with progress on stderr."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.support.services import REPO, resource_types


@pytest.fixture
def cli(docker_host, resource_image, tmp_path):
    env = {
        **os.environ,
        "DOCKER_HOST": docker_host,
        "PYTHONPATH": str(REPO),
        "RESOURCE_TYPES": resource_types(resource_image),
        "STORE_URL": (tmp_path / "store").as_uri(),
        "CACHE_SECRET": "cli",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "functions", "run", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return run


def test_get_unpacks_the_artifact_with_progress(cli, tmp_path):
    out = tmp_path / "fetched"
    done = cli(
        "get",
        "--type",
        "test",
        "--source",
        '{"x": "1"}',
        "--version",
        '{"ref": "9"}',
        "--params",
        '{"kib": 64}',
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["version"] == {"ref": "9"} and reply["cached"] is False
    assert (out / "version").read_text() == "9\n"
    assert (out / "blob").stat().st_size == 64 * 1024
    assert "download to" in done.stderr and "MB/s" in done.stderr


def test_put_uploads_a_local_directory_as_input(cli, tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "version").write_text("local\n")
    (repo / "docs" / "a.txt").write_text("a")
    done = cli("put", "--type", "test", "--params", '{"input": "repo"}', "--input", f"repo={repo}")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["version"] == {"ref": "pushed-local"}
    assert reply["metadata"][0]["value"].split() == ["./docs/a.txt", "./version"]
    assert f"upload {repo}" in done.stderr


def test_failure_exits_non_zero_with_the_error(cli):
    done = cli("check", "--type", "test", "--source", '{"mode": "fail"}')
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["kind"] == "resource_failed"


def test_bad_json_argument_is_reported(cli):
    done = cli("check", "--type", "test", "--source", "{nope")
    assert done.returncode != 0 and "--source: not valid JSON" in done.stderr


@pytest.mark.parametrize("hostile", ["fifo", "socket"])
def test_a_hostile_input_tree_is_one_clear_line_not_a_traceback(cli, tmp_path, hostile):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.txt").write_text("fine\n")
    if hostile == "fifo":
        os.mkfifo(tree / "pipe")
    else:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(tree / "sock"))
    done = cli(
        "put",
        "--type",
        "test",
        "--source",
        "{}",
        "--params",
        '{"input": "in"}',
        "--input",
        f"in={tree}",
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert ("'pipe'" if hostile == "fifo" else "'sock'") in errors[0]
