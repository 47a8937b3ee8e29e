"""``resource-functions artifact pack|unpack`` (functions/cli/artifact.py): the Tekton steps'
way of moving a directory through the store, here against a file:// store."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from functions.cli.commands import main
from storage import open_store
from storage.artifacts import teams_of
from storage.base import key_for_url


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    monkeypatch.setenv("STORE_URL", root.as_uri())
    monkeypatch.delenv("STORE_CREDENTIALS_DIR", raising=False)
    return root


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def pack(directory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    result = tmp_path / "artifact.json"
    assert main(["artifact", "pack", str(directory), "--result", str(result)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(result.read_text()) == printed
    return printed


def test_a_packed_directory_unpacks_the_same_elsewhere(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("alpha\n")
    (source / "sub" / "b.txt").write_text("beta\n")
    artifact = pack(source, tmp_path, capsys)
    assert artifact["url"].startswith(store_env.as_uri() + "/artifacts/inputs/")
    assert artifact["digest"].startswith("sha256:") and artifact["size"] > 0
    target = tmp_path / "out"
    assert main(["artifact", "unpack", json.dumps(artifact), str(target)]) == 0
    assert tree(target) == tree(source)


def test_an_artifact_whose_digest_does_not_match_is_refused(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("alpha\n")
    artifact = pack(source, tmp_path, capsys)
    wrong = {**artifact, "digest": "sha256:" + "0" * 64}
    assert main(["artifact", "unpack", json.dumps(wrong), str(tmp_path / "out")]) == 2
    assert "digest" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("not json", "not JSON"),
        ('{"url": "s3://elsewhere/x.tar.zst", "digest": "sha256:' + "0" * 64 + '"}', "is not"),
        ("{}", '"url"'),
    ],
)
def test_what_is_not_an_artifact_of_this_store_is_refused(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, said: str
) -> None:
    assert main(["artifact", "unpack", given, str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err


def test_an_artifact_without_a_digest_is_not_unpacked(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("alpha\n")
    artifact = pack(source, tmp_path, capsys)
    bare = json.dumps({"url": artifact["url"]})
    assert main(["artifact", "unpack", bare, str(tmp_path / "out")]) == 2
    assert "no digest" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_packed_artifact_is_its_teams_alone(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Put takes only its own team's inputs (issue 31): the pack step says whose it is."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("alpha\n")
    result = tmp_path / "artifact.json"
    argv = ["artifact", "pack", str(source), "--result", str(result), "--team", "ci-web"]
    assert main(argv) == 0
    artifact = json.loads(capsys.readouterr().out)
    store = open_store(store_env.as_uri())
    key = key_for_url(store, artifact["url"])
    assert teams_of(store, key) == {"ci-web"}
    assert teams_of(store, key_for_url(store, pack(source, tmp_path, capsys)["url"])) == {""}


def unpack_as(uid: int, artifact: dict, target: Path) -> str:
    """``unpack`` in a child process running as ``uid`` (the test runs as root, whom no
    permission stops); what it raised, or "" if nothing."""
    from functions.cli.artifact import unpack
    from storage.archive import Limits

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        said = b""
        try:
            os.setgid(uid)
            os.setuid(uid)
            unpack(open_store(os.environ["STORE_URL"]), artifact, target, Limits())
        except BaseException as err:  # noqa: BLE001 - all of it goes back to the test
            said = f"{type(err).__name__}: {err}".encode()
        os.write(write, said)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as got:
        said = got.read().decode()
    os.waitpid(child, 0)
    return said


def test_unpack_into_a_directory_it_cannot_write_says_why_and_what_to_do(
    store_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in a Tekton Task whose step names the directory as its workingDir: Tekton made it
    before any step ran, as another user."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("alpha\n")
    artifact = pack(source, tmp_path, capsys)
    workspace = Path(tempfile.mkdtemp())  # in /tmp: pytest's own directories are root's alone
    try:
        workspace.chmod(0o777)  # as an emptyDir
        target = workspace / "app"
        target.mkdir(mode=0o755)  # root's
        said = unpack_as(65532, artifact, target)
        left = list(target.iterdir())
    finally:
        shutil.rmtree(workspace)
    assert said.startswith("BadArtifact: ")
    assert f"{target} exists and this step (uid 65532) cannot write into it" in said
    assert "owner uid 0, mode 0755" in said and "workingDir" in said
    assert left == []
