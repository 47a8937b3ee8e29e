"""``python -m functions runs|logs|versions`` against every store backend (a directory,
versitygw, fake-gcs-server): runs recorded by the real service code (``create_app``, the
run index, ``steps.collect`` for logs and the history), read back by the command line with
the services' settings from the environment, as an operator would."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from functions import keys
from functions.cli.commands import main
from functions.cli.inspect import Progress
from functions.http.app import create_app
from functions.ledger import run_index
from functions.model import Failure, Outcome, ResourceType
from functions.settings import Settings
from storage import StoreOptions, open_store
from testbed.repository_runtime import RepositoryRuntime
from tests.support.http_helpers import FakeRuntime, event, post
from tests.support.runs import run_of

IMAGE = "example.org/test-resource@sha256:" + "b" * 64
SECRET = "inspect-cache-secret"
REPO_URL = "https://git.example.org/team/repo-secret-7f3a.git"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def deployment(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The services' environment for the command line, and the same settings for the app."""
    creds = tmp_path / "creds"
    (creds / "teams" / "main").mkdir(parents=True)
    (creds / "teams" / "main" / "repo").write_text(REPO_URL + "\n")
    monkeypatch.setenv("STORE_URL", store_url)
    monkeypatch.setenv("CACHE_SECRET", SECRET)
    monkeypatch.setenv("RESOURCE_TYPES", json.dumps({"test": IMAGE}))
    monkeypatch.setenv("CREDENTIALS_DIR", str(creds))
    return Settings(
        store_url=store_url,
        resource_types={"test": ResourceType(image=IMAGE)},
        cache_secret=SECRET.encode(),
        credentials_provider="dir",
        credentials_dir=str(creds),
    )


def serve(settings: Settings, action: str, runtime: Any) -> Any:
    store = open_store(settings.store_url, StoreOptions())
    runtime.store = store
    return create_app(settings, action, store=store, runtime=runtime).test_client()  # type: ignore[arg-type]


def check(settings: Settings, commits: list[str], event_id: str) -> str:
    """A check of the repository (``((repo))`` resolved for team main) from its first
    commit, which finds ``commits``; its run id."""
    runtime = RepositoryRuntime(store=None)  # type: ignore[arg-type]
    runtime.commits = commits
    data = {
        "type": "test",
        "source": {"uri": "((repo))"},
        "version": {"ref": commits[0]},
        "build": {"team": "main"},
    }
    response = post(serve(settings, "check", runtime), event("check", data, id=event_id))
    assert response.status_code == 200, response.data
    return run_of(SECRET, "/ci/pipeline", event_id, "check", team="main")


def failed_get(settings: Settings, event_id: str) -> str:
    failure = Outcome(action="get", failure=Failure("runtime", "the engine went away"))
    data = {"type": "test", "source": {"uri": "x"}, "version": {"ref": "1"}}
    response = post(
        serve(settings, "get", FakeRuntime(None, failure)), event("get", data, id=event_id)
    )  # type: ignore[arg-type]
    assert response.status_code == 200, response.data
    return run_of(SECRET, "/ci/pipeline", event_id, "get")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_runs_lists_what_ran_with_outcome_kind_and_duration(deployment, capsys) -> None:
    checked = check(deployment, ["1", "2"], "check-1")
    failed = failed_get(deployment, "get-1")
    status, out, _ = cli(capsys, "runs")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "STARTED",
        "(UTC)",
        "ACTION",
        "TYPE",
        "OUTCOME",
        "KIND",
        "SECONDS",
        "RUN",
    ]
    rows = {line.split()[-1]: line.split()[2:-1] for line in lines[1:]}
    assert set(rows) == {checked, failed}
    assert rows[checked][:4] == ["check", "test", "succeeded", "-"]
    assert rows[failed][:4] == ["get", "test", "failed", "runtime"]
    for row in rows.values():
        assert 0 <= float(row[4]) < 60  # start to result record
    assert REPO_URL not in out


def test_runs_failed_shows_failures_only(deployment, capsys) -> None:
    check(deployment, ["1"], "check-1")
    failed = failed_get(deployment, "get-1")
    status, out, _ = cli(capsys, "runs", "--failed")
    assert status == 0
    assert [line.split()[-1] for line in out.splitlines()[1:]] == [failed]


def test_runs_since_bounds_the_listing_by_start_time(deployment, capsys) -> None:
    store = open_store(deployment.store_url, StoreOptions())
    earlier = time.time() - 2 * 3600
    run_index.record_start(
        store, run="e" * 32, action="put", type_name=None, image=IMAGE, started=earlier
    )
    recent = check(deployment, ["1"], "check-1")
    _, last_hour, _ = cli(capsys, "runs", "--since", "1h")
    _, three_hours, _ = cli(capsys, "runs", "--since", "3h")
    assert [line.split()[-1] for line in last_hour.splitlines()[1:]] == [recent]
    rows = [line.split() for line in three_hours.splitlines()[1:]]
    assert [row[-1] for row in rows] == ["e" * 32, recent]
    assert rows[0][2:-1] == ["put", IMAGE, "unfinished", "-", "-"]  # no result recorded


def test_logs_prints_the_stored_redacted_log(deployment, capsys) -> None:
    run = check(deployment, ["1"], "check-1")
    store = open_store(deployment.store_url, StoreOptions())
    with store.open(keys.log_key(run)) as stream:
        stored = stream.read().decode()
    status, out, _ = cli(capsys, "logs", run)
    assert status == 0 and out == stored
    status, out, err = cli(capsys, "logs", "0" * 32)
    assert status == 1 and out == "" and f"no log for run {'0' * 32}" in err


def test_logs_refuses_what_is_not_a_run_id(deployment, capsys) -> None:
    status, _, err = cli(capsys, "logs", "../results/x")
    assert status == 2 and err.startswith("error: RUN_ID '../results/x'")


def test_versions_prints_the_history_newest_first(deployment, capsys) -> None:
    check(deployment, ["1", "2"], "check-1")
    check(deployment, ["1", "2", "3"], "check-2")
    source = json.dumps({"uri": "((repo))"})
    status, out, _ = cli(capsys, "versions", "--type", "test", "--source", source, "--team", "main")
    assert status == 0, out
    lines = out.splitlines()
    assert "3 versions, last checked" in lines[0]
    assert lines[1:] == ["#    VERSION", "3    ref:3", "2    ref:2", "1    ref:1"]
    assert REPO_URL not in out


def test_versions_of_the_resolved_source_is_the_same_resource(deployment, capsys, tmp_path) -> None:
    check(deployment, ["1"], "check-1")
    (tmp_path / "source.json").write_text(json.dumps({"uri": REPO_URL}))
    source = f"@{tmp_path / 'source.json'}"
    status, out, _ = cli(capsys, "versions", "--type", "test", "--source", source, "--team", "main")
    assert status == 0 and "1 versions" in out.splitlines()[0]
    # Another team's history of the same source is its own (checks are scoped per team).
    status, out, _ = cli(capsys, "versions", "--type", "test", "--source", source)
    assert status == 0 and out.endswith("no successful check recorded\n")


def test_versions_needs_the_requests_credentials(deployment, capsys) -> None:
    check(deployment, ["1"], "check-1")
    source = json.dumps({"uri": "((repo))"})
    status, out, err = cli(
        capsys, "versions", "--type", "test", "--source", source, "--team", "other"
    )
    assert status == 2 and out == ""
    assert err.splitlines() == [f"error: {err.splitlines()[0][7:]}"]
    assert "((repo)) cannot be resolved" in err


def test_versions_of_an_unchecked_resource_says_so(deployment, capsys) -> None:
    status, out, _ = cli(capsys, "versions", "--type", "test", "--source", '{"uri": "y"}')
    assert status == 0 and out.endswith("no successful check recorded\n")


def test_versions_of_an_unknown_type_is_an_error(deployment, capsys) -> None:
    status, _, err = cli(capsys, "versions", "--type", "nope", "--source", "{}")
    assert status == 2 and err.startswith("error: ") and "nope" in err


def test_runs_without_runs_prints_the_header_only(deployment, capsys) -> None:
    status, out, err = cli(capsys, "runs", "--since", "30m")
    assert status == 0 and len(out.splitlines()) == 1 and err == ""


@pytest.mark.parametrize("since", ["1x", "h", "-1h"])
def test_runs_refuses_a_malformed_since(deployment, capsys, since) -> None:
    status, _, err = cli(capsys, "runs", f"--since={since}")
    assert status == 2 and err.startswith(f"error: --since {since!r}")


def test_progress_shows_long_listings_only() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(out, interval=0.5, clock=lambda: now[0])
    progress(1, 3)
    assert out.getvalue() == ""  # quick so far
    now[0] = 0.6
    progress(2, 3)
    progress(3, 3)
    assert out.getvalue() == "runs: 2/3 records read\rruns: 3/3 records read\n"
    quick = io.StringIO()
    Progress(quick, interval=0.5, clock=lambda: 0.0)(3, 3)
    assert quick.getvalue() == ""


def run_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "functions", *argv],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_missing_store_directory_is_one_line_and_status_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "STORE_URL": (tmp_path / "absent").as_uri()}
    for argv in (["runs"], ["logs", "a" * 32]):
        done = run_cli(env, *argv)
        assert done.returncode == 2, done
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: ")


def test_a_malformed_store_url_is_one_line_and_status_2() -> None:
    done = run_cli({"PATH": "/usr/bin:/bin", "STORE_URL": "ftp://x/y"}, "runs")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done
    assert done.stderr.startswith("error: ")


def test_s3_with_wrong_credentials_is_one_line_and_status_2(s3_endpoint, s3_bucket) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        **{k: v for k, v in s3_endpoint.env.items() if v is not None},
        "AWS_SECRET_ACCESS_KEY": "not-the-secret",
        "STORE_URL": f"s3://{s3_bucket}/inspect",
    }
    done = run_cli(env, "runs")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done
    assert done.stderr.startswith("error: ") and "not-the-secret" not in done.stderr


def test_s3_with_a_missing_bucket_is_one_line_and_status_2(s3_endpoint) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        **{k: v for k, v in s3_endpoint.env.items() if v is not None},
        "STORE_URL": "s3://rf-no-such-bucket-4a1e/x",
    }
    done = run_cli(env, "runs")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done
