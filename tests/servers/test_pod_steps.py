"""The in-pod steps (``python -m functions stage|collect``) against a real S3 server: what
each records, and its exit status (0 = outcome recorded, whatever it says)."""

from __future__ import annotations

import io
import itertools
import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from functions import cli, keys
from functions.model import ArtifactRef, HistoryPlan, Phase, TraceContext
from functions.redaction import secret_values
from functions.steps import stage_collect
from functions.steps.pod_contract import (
    TERMINATION_MESSAGE_BYTES,
    CollectStep,
    ReplyPlan,
    StageStep,
    StepFailure,
    StepTimings,
)
from functions.task import in_pod, untrusted_files
from functions.task.step_settings import StepSettings
from storage import StoreOptions, get_json, open_store
from storage.archive import ArchiveOptions
from storage.artifacts import upload_tree
from testbed.event_sink import event_sink

CANARY = "canary-7d3f9b2e-do-not-leak"
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RUN = uuid.uuid4().hex


@pytest.fixture
def store(s3_env: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    store = open_store(f"s3://{s3_bucket}/steps-{uuid.uuid4().hex[:12]}", StoreOptions())
    monkeypatch.setenv("STORE_URL", store.url)
    monkeypatch.delenv("K_SINK", raising=False)
    return store


@pytest.fixture
def build(tmp_path: Path) -> Path:
    (tmp_path / "build/.task").mkdir(parents=True)
    source = {"password": CANARY}
    (tmp_path / "stdin").write_text(json.dumps({"source": source}))
    # The values to redact, as the function computes them into the stdin Secret.
    (tmp_path / "redact").write_text(json.dumps(secret_values(source=source, params={})))
    return tmp_path / "build"


def collect(build: Path, action: str = "check", **given: Any) -> int:
    step = CollectStep(
        run_id=RUN,
        action=action,  # type: ignore[arg-type]
        build_dir=str(build),
        stdin_file=str(build.parent / "stdin"),
        **given,
    )
    return cli.main(step.argv())


def reported(termination: Path) -> tuple[str, bool, str]:
    """A step's termination message as (kind, retryable, what failed: its first two parts)."""
    failure = StepFailure.parse(termination.read_text())
    assert failure is not None, termination.read_text()
    return failure.kind, failure.retryable, ":".join(failure.message.split(":")[:2])


def result(store: Any, run: str = RUN) -> dict[str, Any]:
    return get_json(store, keys.result_key(run))


def stage_as_input_repo(store: Any, source: Path, tmp_path: Path) -> Path:
    """Upload ``source`` as an artifact and run the stage step with it as input ``repo``;
    returns the put directory."""
    key = f"artifacts/{uuid.uuid4().hex}.tar.zst"
    info = upload_tree(store, key, source, ArchiveOptions())
    put = tmp_path / "build/put"
    step = StageStep(
        directory=str(put),
        inputs=(("repo", ArtifactRef(key, info.digest)),),
        task_dir=str(tmp_path / "build/.task"),
    )
    assert cli.main(step.argv()) == 0
    return put


def test_stage_unpacks_inputs_and_checks_digests(store: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "dir").mkdir(parents=True)
    (source / "dir/file.txt").write_text("payload")
    put = stage_as_input_repo(store, source, tmp_path)
    assert (put / "repo/dir/file.txt").read_text() == "payload"
    assert not (tmp_path / "build/.task/stage-error").exists()


def test_stage_opens_a_tree_holding_symlinks_to_directories(store: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "dir/sub").mkdir(parents=True)
    (source / "dir/sub/file.txt").write_text("payload")
    (source / "dir/sub/file.txt").chmod(0o600)
    (source / "dir-link").symlink_to("dir")
    (source / "dir/sub-link").symlink_to("sub")
    (source / "file-link").symlink_to("dir/sub/file.txt")
    put = stage_as_input_repo(store, source, tmp_path)
    repo = put / "repo"
    assert os.readlink(repo / "dir-link") == "dir" and os.readlink(repo / "dir/sub-link") == "sub"
    assert (repo / "dir-link/sub/file.txt").read_text() == "payload"
    for directory in (repo, repo / "dir", repo / "dir/sub"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o777, directory
    assert stat.S_IMODE((repo / "dir/sub/file.txt").stat().st_mode) == 0o666


def test_make_writable_by_all_leaves_symlinks_and_their_targets_alone(tmp_path: Path) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "dir").mkdir(parents=True)
    outside.mkdir(mode=0o700)
    (tree / "dir/run.sh").write_text("#!/bin/sh\n")
    (tree / "dir/run.sh").chmod(0o700)
    (tree / "to-outside").symlink_to(outside)
    (tree / "dangling").symlink_to(tmp_path / "missing")
    in_pod.make_writable_by_all(tree)
    assert stat.S_IMODE((tree / "dir").stat().st_mode) == 0o777
    assert stat.S_IMODE((tree / "dir/run.sh").stat().st_mode) == 0o777
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700


def test_a_missing_input_is_a_stage_error_not_a_failed_pod(store: Any, tmp_path: Path) -> None:
    task_dir = tmp_path / "build/.task"
    argv = [
        "stage",
        "--dir",
        str(tmp_path / "build/put"),
        "--task-dir",
        str(task_dir),
        "--input",
        "repo=artifacts/missing.tar.zst",
    ]
    assert cli.main(argv) == 0
    assert "does not exist" in (task_dir / "stage-error").read_text()
    assert collect(tmp_path / "build", "put") == 0
    failure = result(store)["error"]
    assert failure["kind"] == "storage" and "artifacts/missing.tar.zst" in failure["message"]


def test_an_unreachable_store_fails_the_stage_step_as_retryable(
    tmp_path: Path, unused_port: int, termination: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{unused_port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("STORE_URL", "s3://bucket/prefix")
    status = in_pod.stage_main(
        StageStep(
            directory=str(tmp_path / "put"),
            inputs=(("repo", ArtifactRef("artifacts/x.tar.zst")),),
            task_dir=str(tmp_path / ".task"),
        ),
        settings=StepSettings.from_env({"STORE_URL": "s3://bucket/prefix"}),
    )
    assert status == 1
    assert reported(termination) == ("storage", True, "stage: the store is unavailable")
    assert not (tmp_path / ".task/stage-error").exists()


def test_collect_records_a_check(store: Any, build: Path) -> None:
    (build / ".task/exit-code").write_text("0\n")
    (build / ".task/stdout").write_text('[{"ref": "1"}] trailing')
    (build / ".task/stderr").write_text(f"using {CANARY}\n")
    assert collect(build) == 0
    recorded = result(store)
    assert isinstance(recorded.pop("finished_at"), float)
    assert recorded == {"action": "check", "data": {"versions": [{"ref": "1"}]}}
    with store.open(keys.log_key(RUN)) as stream:
        assert stream.read() == b"using [redacted]\n"


def test_a_missing_exit_code_is_a_runtime_failure(store: Any, build: Path) -> None:
    (build / ".task/stderr").write_text("sh: cannot open /secret/stdin\n")
    assert collect(build) == 0
    failure = result(store)["error"]
    assert failure["kind"] == "runtime" and "no exit code" in failure["message"]
    assert "cannot open" in failure["log_tail"]


def test_collect_keeps_the_tail_of_a_huge_log(
    store: Any, build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage_collect, "MAX_STDERR_BYTES", 1000)
    (build / ".task/exit-code").write_text("1")
    (build / ".task/stderr").write_text("x" * 5000 + "\nthe real error\n")
    assert collect(build) == 0
    with store.open(keys.log_key(RUN)) as stream:
        log = stream.read()
    assert len(log) == 1000 and log.endswith(b"the real error\n")


def test_the_first_record_wins(store: Any, build: Path) -> None:
    (build / ".task/exit-code").write_text("0")
    (build / ".task/stdout").write_text("[]")
    assert collect(build) == 0
    (build / ".task/stdout").write_text('[{"ref": "other"}]')
    assert collect(build) == 0
    assert result(store)["data"] == {"versions": []}


def test_reply_without_k_sink_records_then_fails(
    store: Any, build: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (build / ".task/exit-code").write_text("0")
    (build / ".task/stdout").write_text("[]")
    assert collect(build, "check", reply=ReplyPlan("r1")) != 0
    assert "K_SINK" in capsys.readouterr().err
    assert result(store)["data"] == {"versions": []}


def test_an_unreachable_store_fails_collect_as_retryable(
    build: Path, termination: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORE_URL", "file:///nonexistent-store-dir-for-test")
    (build / ".task/exit-code").write_text("0")
    (build / ".task/stdout").write_text("[]")
    assert collect(build) == 1
    assert reported(termination) == ("storage", True, "collect: the store is unavailable")


def test_a_misconfigured_store_fails_collect_for_good(
    build: Path, termination: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORE_URL", "ftp://bucket/prefix")
    (build / ".task/exit-code").write_text("0")
    assert collect(build) == 1
    assert reported(termination) == ("storage", False, "collect: cannot record the outcome")


def test_a_timed_out_script_is_a_timeout_with_its_log(store: Any, build: Path) -> None:
    # What RESOURCE_SCRIPT leaves when its watchdog stopped the script (see test_pod_spec).
    (build / ".task/exit-code").write_text("124\n")
    (build / ".task/timed-out").write_text("45\n")
    (build / ".task/stdout").write_text('{"version": {"ref": "half-done"}}')
    (build / ".task/stderr").write_text(f"cloning with {CANARY}...\n")
    assert collect(build, "get", cache_key="c" * 64) == 0
    assert result(store)["error"] == {
        "kind": "timeout",
        "message": "the resource script ran longer than 45s",
        "log_tail": "cloning with [redacted]...\n",
    }
    with store.open(keys.log_key(RUN)) as stream:
        assert stream.read() == b"cloning with [redacted]...\n"
    assert not list(store.list("artifacts/"))


def test_termination_message_reports_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(in_pod, "TERMINATION_LOG", log)
    assert in_pod.fail("collect: cannot record the outcome: store down") == 1
    assert StepFailure.parse(log.read_text()) == StepFailure(
        "runtime", False, "collect: cannot record the outcome: store down"
    )
    long = "x" * 10_000
    in_pod.fail(long, kind="storage", retryable=True)
    assert len(log.read_bytes()) <= TERMINATION_MESSAGE_BYTES  # the kubelet keeps 4096 at most
    kept = StepFailure.parse(log.read_text())
    assert kept is not None and kept.retryable and kept.message == long[-len(kept.message) :]


def test_bounded_reads(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert in_pod.read_head(path, 4) == b"0123"
    assert in_pod.read_head(tmp_path / "missing", 4) == b""
    with untrusted_files.directory(str(tmp_path), ".") as here:
        assert untrusted_files.read_head(here, "f", 4) == b"0123"
        assert untrusted_files.read_tail(here, "f", 4) == b"6789"
        assert untrusted_files.read_tail(here, "f", 40) == b"0123456789"
        assert untrusted_files.read_tail(here, "missing", 4) is None
    with untrusted_files.directory(str(tmp_path), "absent") as absent:
        assert absent is None and untrusted_files.read_head(absent, "f", 4) is None


def test_collect_of_an_async_check_records_the_history_and_posts_discoveries_then_reply(
    store: Any, build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resource = uuid.uuid4().hex
    store.write_record(f"history/{resource}.json", b'{"versions": [{"ref": "1"}]}', None)
    (build / ".task/exit-code").write_text("0")
    (build / ".task/stdout").write_text('[{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]')
    history = HistoryPlan(resource, limit=2)
    reply = ReplyPlan("r1", "main/repo", trace=TraceContext(PARENT, "congo=t61rcWkgMzE"))
    with event_sink() as sink:
        monkeypatch.setenv("K_SINK", sink.url)
        assert collect(build, "check", history=history, reply=reply) == 0
        posted = sink.drain()
    assert [e.get_type().rsplit(".", 1)[-1] for e in posted] == ["discovered"] * 2 + ["succeeded"]
    assert [e.get_data()["version"] for e in posted[:2]] == [{"ref": "2"}, {"ref": "3"}]
    assert {e.get_data()["resource"] for e in posted[:2]} == {resource}
    assert posted[2].get_data()["new"] == [{"ref": "2"}, {"ref": "3"}]
    assert {(e.get_extension("requestid"), e.get_subject()) for e in posted} == {
        ("r1", "main/repo")
    }
    assert {(e.get_extension("traceparent"), e.get_extension("tracestate")) for e in posted} == {
        (PARENT, "congo=t61rcWkgMzE")
    }
    assert not [body for body in sink.bodies if CANARY.encode() in body]
    recorded = json.loads(store.read_record(f"history/{resource}.json").data)
    assert recorded["versions"] == [{"ref": "2"}, {"ref": "3"}]  # bounded to the limit


def test_the_steps_reach_s3_with_the_store_secret_as_files_and_no_credential_in_env(
    s3_env: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "store-secret"
    secret.mkdir()
    key = os.environ["AWS_SECRET_ACCESS_KEY"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"):
        (secret / name).write_text(os.environ[name] + "\n")  # as a Secret's file may end
        monkeypatch.delenv(name)
    (secret / "AWS_REGION").write_text("us-east-1")
    for name in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-such-file"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-such-file"))
    url = f"s3://{s3_bucket}/files-{uuid.uuid4().hex[:8]}"

    settings = StepSettings.from_env({"STORE_URL": url, "STORE_CREDENTIALS_DIR": str(secret)})
    store = open_store(settings.store_url, settings.store_options)
    store.put("results/x.json", io.BytesIO(b"{}"))

    assert store.stat("results/x.json") is not None
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ
    assert key not in repr(settings)  # the keys are kept out of reprs (logs)


def test_an_unmounted_store_secret_makes_the_step_retry(
    tmp_path: Path, termination: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("STORE_CREDENTIALS_DIR", str(tmp_path / "not-mounted"))
    step = CollectStep(run_id=RUN, action="check", build_dir=str(tmp_path))
    assert cli.main(step.argv()) == 1
    assert reported(termination)[:2] == ("storage", True)


def test_a_successful_collect_reports_where_the_pod_spent_its_time(
    store: Any, build: Path, termination: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its termination message: the script (the resource step's marker files), the
    interpreter's start and collect's own steps, on the wall clock, in order."""
    (build / ".task/started").write_text("")
    (build / ".task/exit-code").write_text("0\n")
    (build / ".task/stdout").write_text('{"version": {"ref": "1"}}')
    (build / "get").mkdir()
    (build / "get/f").write_text("x")
    now = time.time_ns()
    os.utime(build / ".task/started", ns=(now - 3_000_000_000, now - 3_000_000_000))
    os.utime(build / ".task/exit-code", ns=(now - 1_000_000_000, now - 1_000_000_000))
    with event_sink() as sink:
        monkeypatch.setenv("K_SINK", sink.url)
        assert collect(build, "get", cache_key=uuid.uuid4().hex * 2, reply=ReplyPlan("r1")) == 0
    timings = StepTimings.parse(termination.read_text())
    assert timings is not None, termination.read_text()
    names = [phase.name for phase in timings.phases]
    # This process started long before the script ended: no collect_start to report.
    assert names == ["script", "collect_import", "upload", "store", "reply"]
    script = timings.phases[0]
    assert (script.start_ns, script.end_ns) == (now - 3_000_000_000, now - 1_000_000_000)
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(timings.phases[1:]))


@pytest.mark.parametrize("hostile", ["link", "future"])
def test_timings_the_resource_step_could_have_forged_are_left_out(
    store: Any, build: Path, termination: Path, hostile: str
) -> None:
    (build / ".task/exit-code").write_text("0\n")
    (build / ".task/stdout").write_text('[{"ref": "1"}]')
    if hostile == "link":
        (build / ".task/started").symlink_to("/proc/self/environ")
    else:
        (build / ".task/started").write_text("")
        later = time.time_ns() + 3600 * 10**9
        os.utime(build / ".task/exit-code", ns=(later, later))
    assert collect(build) == 0
    timings = StepTimings.parse(termination.read_text())
    assert timings is not None and "script" not in [p.name for p in timings.phases]


def test_step_timings_parse_only_what_collect_writes() -> None:
    good = StepTimings((Phase("script", 1, 2), Phase("store", 2, 5)))
    assert StepTimings.parse(good.termination_message()) == good
    for text in (
        '{"phases": [["anything", 1, 2]]}',  # a label value the metrics do not know
        '{"phases": [["script", 2, 1]]}',
        '{"phases": [["script", 1.5, 2]]}',
        '{"phases": [["script", true, 2]]}',
        '{"phases": {}}',
        '{"kind": "storage", "retryable": true, "message": "x"}',
        "not json",
    ):
        assert StepTimings.parse(text) is None, text
