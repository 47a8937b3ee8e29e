"""``resource-functions artifact pack|unpack`` (functions/cli/artifact.py) against the
artifacts service (functions/tekton/artifact_service.py) served on loopback over a file:// store:
a Tekton step's way of moving a directory, with its pod's token and no store credential.

The API server's TokenReview is the one part that cannot run here: a plain function maps
each test token to a ServiceAccount (the cluster tier reviews real tokens). Namespaces map to
teams as the controller maps them (``NamespaceTeams``, labels given as data)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server

from functions import keys
from functions.cli import artifact as artifact_cli
from functions.cli.artifact import ArtifactsService
from functions.cli.commands import main
from functions.http.senders import SenderCheck
from functions.ledger.inputs import sweep_inputs, sweeper
from functions.settings import UploadLimits
from functions.tekton import uploads as uploads_module
from functions.tekton.artifact_service import create_artifacts_app
from functions.tekton.namespace_teams import TEAM_LABEL, NamespaceTeams
from functions.tekton.uploads import Busy, Uploads
from storage import Store, open_store
from storage.archive import ArchiveOptions, Limits
from storage.archive import pack as pack_tree
from storage.artifacts import add_team, teams_of
from storage.base import key_for_url

AUDIENCE = "resource-functions-artifacts"
ACCOUNTS = {
    "token-a": "system:serviceaccount:ci-a:default",
    "token-b": "system:serviceaccount:ci-b:builder",
    "token-stranger": "system:serviceaccount:scratch:default",  # no team label
}
LABELS = {"ci-a": {TEAM_LABEL: "a"}, "ci-b": {TEAM_LABEL: "b"}, "scratch": {"team": "a"}}
MAX_BYTES = 1 << 20


def review(token: str, audience: str) -> str | None:
    return ACCOUNTS.get(token) if audience == AUDIENCE else None


@dataclass
class Service:
    url: str
    store: Store
    tokens: Path  # a file per token name, as the projected volume would hold it
    uploads: Uploads  # what the service takes in uploads

    def as_step(self, monkeypatch: pytest.MonkeyPatch, token: str) -> None:
        """The environment of a step of the namespace whose token is ``token``."""
        monkeypatch.setenv("ARTIFACTS_URL", self.url)
        monkeypatch.setenv("ARTIFACTS_TOKEN_FILE", str(self.tokens / token))

    def client(self, token: str) -> ArtifactsService:
        return ArtifactsService(self.url, self.tokens / token)


@pytest.fixture
def limits() -> UploadLimits:
    """What the service takes in uploads (a test may replace it before asking for
    ``service``)."""
    return UploadLimits()


@pytest.fixture
def service(tmp_path: Path, limits: UploadLimits) -> Iterator[Service]:
    root = tmp_path / "store"
    root.mkdir()
    store = open_store(root.as_uri())
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name in ACCOUNTS:
        (tokens / name).write_text(name + "\n")
    (tokens / "forged").write_text("forged")
    uploads = Uploads(store, limits)
    app = create_artifacts_app(
        store,
        SenderCheck(review, AUDIENCE, ("system:serviceaccount:*",)),
        NamespaceTeams(None, LABELS.get),
        MAX_BYTES,
        uploads,
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Service(f"http://127.0.0.1:{server.server_port}", store, tokens, uploads)
    finally:
        server.shutdown()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def source_tree(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("alpha\n")
    (source / "sub" / "b.txt").write_text("beta\n")
    return source


def pack(directory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    result = tmp_path / "artifact.json"
    assert main(["artifact", "pack", str(directory), "--result", str(result)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(result.read_text()) == printed
    return printed


def test_a_packed_directory_unpacks_the_same_in_another_task_of_the_team(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = source_tree(tmp_path)
    service.as_step(monkeypatch, "token-a")
    artifact = pack(source, tmp_path, capsys)
    assert artifact["url"].startswith(service.store.url + "/artifacts/inputs/")
    key = key_for_url(service.store, artifact["url"])
    assert key is not None and teams_of(service.store, key) == {"a"}
    stored = service.store.stat(key)
    assert stored is not None and (artifact["size"], artifact["digest"]) == (
        stored.size,
        stored.digest,
    )
    target = tmp_path / "out"
    assert main(["artifact", "unpack", json.dumps(artifact), str(target)]) == 0
    assert tree(target) == tree(source)


def test_a_task_of_another_team_gets_403_and_reads_nothing(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service.as_step(monkeypatch, "token-a")
    artifact = pack(source_tree(tmp_path), tmp_path, capsys)
    service.as_step(monkeypatch, "token-b")
    target = tmp_path / "out"
    assert main(["artifact", "unpack", json.dumps(artifact), str(target)]) == 2
    said = capsys.readouterr().err
    assert "403" in said and "not an artifact of team 'b'" in said
    assert not any(target.iterdir())
    answer = requests.get(
        f"{service.url}/artifacts",
        params={"url": artifact["url"]},
        headers={"Authorization": "Bearer token-b"},
        timeout=10,
    )
    assert answer.status_code == 403 and answer.json()["error"]["kind"] == "input_not_allowed"


@pytest.mark.parametrize(
    ("token", "status", "said"),
    [
        ("forged", 401, "not valid"),
        ("token-stranger", 403, "'scratch' is not served"),
    ],
    ids=["a-token-the-api-refuses", "a-namespace-serving-no-team"],
)
def test_a_step_without_a_teams_identity_is_refused(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token: str,
    status: int,
    said: str,
) -> None:
    service.as_step(monkeypatch, token)
    assert main(["artifact", "pack", str(source_tree(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert str(status) in err and said in err
    assert not list(service.store.list("artifacts/"))


def test_no_token_at_all_is_401(service: Service) -> None:
    answer = requests.get(f"{service.url}/artifacts", params={"url": "x"}, timeout=10)
    assert answer.status_code == 401


def test_a_packed_artifact_is_the_callers_teams_whatever_the_step_says(
    service: Service, tmp_path: Path
) -> None:
    packed = service.client("token-b").pack(source_tree(tmp_path), ArchiveOptions())
    key = key_for_url(service.store, packed["url"])
    assert key is not None and teams_of(service.store, key) == {"b"}
    answer = requests.post(
        f"{service.url}/artifacts",
        params={"format": "none", "team": "a"},
        headers={"Authorization": "Bearer token-b"},
        data=b"\0" * 1024,
        timeout=10,
    )
    assert answer.status_code == 201
    key = key_for_url(service.store, answer.json()["url"])
    assert key is not None and teams_of(service.store, key) == {"b"}


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://elsewhere/artifacts/x.tar.zst", "is not an artifact URL"),
        ("{store}/artifacts/k.json", "no archive suffix"),
        ("{store}/artifacts/k.teams.json", "no archive suffix"),
        ("{store}/results/r.json", "is not an artifact URL"),
        ("{store}/artifacts/../results/r.tar.zst", "is not an artifact URL"),
        ("", "is not an artifact URL"),
    ],
    ids=["another-store", "a-cache-record", "a-team-record", "a-result", "climbing", "none"],
)
def test_only_artifacts_of_this_store_are_served(service: Service, url: str, said: str) -> None:
    answer = requests.get(
        f"{service.url}/artifacts",
        params={"url": url.format(store=service.store.url)},
        headers={"Authorization": "Bearer token-a"},
        timeout=10,
    )
    assert answer.status_code == 400 and said in answer.json()["error"]["message"]


def test_an_upload_over_the_bound_is_413_and_leaves_no_artifact(service: Service) -> None:
    chunks = iter([b"\0" * 65536] * ((MAX_BYTES >> 16) + 2))
    answer = requests.post(
        f"{service.url}/artifacts",
        params={"format": "none"},
        headers={"Authorization": "Bearer token-a"},
        data=chunks,
        timeout=30,
    )
    assert answer.status_code == 413
    assert not [k for k in service.store.list("artifacts/") if not k.endswith(".teams.json")]


def test_an_unknown_format_is_400(service: Service) -> None:
    answer = requests.post(
        f"{service.url}/artifacts",
        params={"format": "rar"},
        headers={"Authorization": "Bearer token-a"},
        data=b"x",
        timeout=10,
    )
    assert answer.status_code == 400 and "rar" in answer.json()["error"]["message"]


def test_an_artifact_whose_digest_does_not_match_is_refused(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service.as_step(monkeypatch, "token-a")
    artifact = pack(source_tree(tmp_path), tmp_path, capsys)
    wrong = {**artifact, "digest": "sha256:" + "0" * 64}
    assert main(["artifact", "unpack", json.dumps(wrong), str(tmp_path / "out")]) == 2
    assert "digest" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "said"),
    [("not json", "not JSON"), ("{}", '"url"'), ('{"url": "x.tar.zst"}', "no digest")],
)
def test_what_is_not_an_artifact_is_refused_before_any_request(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    said: str,
) -> None:
    service.as_step(monkeypatch, "token-a")
    assert main(["artifact", "unpack", given, str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_without_the_services_address_the_step_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARTIFACTS_URL", raising=False)
    assert main(["artifact", "pack", str(tmp_path)]) == 2
    said = capsys.readouterr().err
    assert "ARTIFACTS_URL" in said
    assert "--input NAME=DIR" in said  # what a local user runs instead


def test_a_missing_token_file_names_the_projected_volume(
    service: Service,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service.as_step(monkeypatch, "no-such-token")
    assert main(["artifact", "pack", str(source_tree(tmp_path))]) == 2
    assert "projected token volume" in capsys.readouterr().err


def unpack_as(uid: int, service: ArtifactsService, artifact: dict, target: Path) -> str:
    """``unpack`` in a child process running as ``uid`` (the test runs as root, whom no
    permission stops); what it raised, or "" if nothing."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        said = b""
        try:
            os.setgid(uid)
            os.setuid(uid)
            service.unpack(artifact, target, Limits())
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
    service: Service, tmp_path: Path
) -> None:
    """As in a Tekton Task whose step names the directory as its workingDir: Tekton made it
    before any step ran, as another user."""
    client = service.client("token-a")
    artifact = client.pack(source_tree(tmp_path), ArchiveOptions())
    workspace = Path(tempfile.mkdtemp())  # in /tmp: pytest's own directories are root's alone
    try:
        workspace.chmod(0o777)  # as an emptyDir
        target = workspace / "app"
        target.mkdir(mode=0o755)  # root's
        token = workspace / "token"
        token.write_text("token-a")
        token.chmod(0o644)
        said = unpack_as(65532, ArtifactsService(service.url, token), artifact, target)
        left = list(target.iterdir())
    finally:
        shutil.rmtree(workspace)
    assert said.startswith("BadArtifact: ")
    assert f"{target} exists and this step (uid 65532) cannot write into it" in said
    assert "owner uid 0, mode 0755" in said and "workingDir" in said
    assert left == []


# --- what a team and a replica take in uploads (issue 50) --------------------------------------


def post_upload(service: Service, token: str, body: bytes, format: str = "zstd") -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    url = service.url + "/artifacts"
    return requests.post(url, params={"format": format}, headers=headers, data=body, timeout=10)


def inputs_of(store: Store) -> list[str]:
    return [k for k in store.list("artifacts/inputs/") if not k.endswith(".teams.json")]


@pytest.mark.parametrize(
    ("format", "body"),
    [
        ("zstd", b"#!/bin/sh\necho any file at all\n"),
        ("gzip", b"\x28\xb5\x2f\xfd" + b"zstd, said to be gzip"),
        ("none", b"not a tar" * 100),
        ("none", b"short"),
    ],
    ids=["script-as-zstd", "zstd-as-gzip", "text-as-tar", "too-short-for-tar"],
)
def test_an_upload_that_is_not_its_format_is_400_and_stores_nothing(
    service: Service, format: str, body: bytes
) -> None:
    answer = post_upload(service, "token-a", body, format)
    assert answer.status_code == 400, answer.text
    assert "does not start as a" in answer.json()["error"]["message"]
    assert inputs_of(service.store) == []


def test_an_empty_directory_is_an_upload_of_its_format(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    (tmp_path / "empty").mkdir()
    service.as_step(monkeypatch, "token-a")
    for format in ("zstd", "gzip", "none"):
        result = tmp_path / f"{format}.json"
        monkeypatch.setenv("ARCHIVE_FORMAT", format)
        args = ["artifact", "pack", str(tmp_path / "empty"), "--result", str(result)]
        assert main(args) == 0
        assert json.loads(result.read_text())["format"] == format
    assert len(inputs_of(service.store)) == 3


@pytest.mark.parametrize(
    "limits",
    [UploadLimits(count_per_hour=2), UploadLimits(bytes_per_hour=1)],
    ids=["count", "bytes"],
)
def test_a_team_past_its_hourly_quota_gets_429_until_the_hour_ends_and_others_go_on(
    service: Service, limits: UploadLimits, tmp_path: Path, capsys, monkeypatch
) -> None:
    source = source_tree(tmp_path)
    service.as_step(monkeypatch, "token-a")
    allowed = limits.count_per_hour if limits.count_per_hour < 100 else 1
    for _ in range(allowed):
        pack(source, tmp_path, capsys)
    with pack_tree(source, ArchiveOptions()) as stream:
        refused = post_upload(service, "token-a", stream.read())
    assert refused.status_code == 429, refused.text
    assert "team 'a' is at its upload quota" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 3600
    monkeypatch.setattr(artifact_cli, "BUSY_WAIT_SECONDS", 0)  # the step would wait the hour
    assert main(["artifact", "pack", str(source)]) == 2
    assert "upload quota" in capsys.readouterr().err
    service.as_step(monkeypatch, "token-b")  # another team's quota is its own
    assert pack(source, tmp_path, capsys)["url"]
    assert len(inputs_of(service.store)) == allowed + 1


def slot_held(service: Service, team: str) -> tuple[threading.Event, threading.Thread]:
    """An upload of ``team`` holding one of the replica's slots until ``gate`` is set."""
    gate, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with service.uploads.slot(team, datetime.now(UTC)):
            taken.set()
            gate.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(5)
    return gate, holder


@pytest.mark.parametrize("limits", [UploadLimits(per_replica=1)], ids=["one-at-once"])
def test_a_replica_at_its_uploads_at_once_answers_429_and_the_step_waits_its_turn(
    service: Service, limits: UploadLimits, tmp_path: Path, capsys, monkeypatch
) -> None:
    """One upload holds the replica's only slot; the pack step is told 429 with
    ``Retry-After``, waits, and goes in once the slot is free."""
    monkeypatch.setattr(uploads_module, "BUSY_RETRY_SECONDS", 1)
    gate, holder = slot_held(service, "b")  # another upload, in the replica's only slot
    with pack_tree(source_tree(tmp_path), ArchiveOptions()) as stream:
        busy = post_upload(service, "token-a", stream.read())
    assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
    assert "uploads at once" in busy.json()["error"]["message"]
    threading.Timer(1.5, gate.set).start()
    service.as_step(monkeypatch, "token-a")
    assert main(["artifact", "pack", str(source_tree(tmp_path / "again"))]) == 0
    holder.join(10)
    said = capsys.readouterr()
    assert json.loads(said.out)["url"] and "artifacts service busy" in said.err


def test_every_replica_counts_a_teams_uploads_in_the_store(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    store = open_store((tmp_path / "store").as_uri())
    limits = UploadLimits(count_per_hour=3)
    replicas = [Uploads(store, limits), Uploads(store, limits)]
    now = datetime(2026, 12, 5, 10, 59, 30, tzinfo=UTC)
    for n in range(3):
        with replicas[n % 2].slot("a", now):
            pass
    with pytest.raises(Busy) as over, replicas[1].slot("a", now):
        pass
    assert over.value.retry_after == 30
    with replicas[0].slot("a", now.replace(hour=11, minute=0)):  # a new hour, a new count
        pass


def test_inputs_from_before_their_days_are_swept_with_their_team_records(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    store = open_store((tmp_path / "store").as_uri())
    now = datetime(2026, 12, 10, 9, 0, tzinfo=UTC)
    made = {}
    for age in (0, 7, 8, 30):
        key = keys.input_key(".tar.zst", now - timedelta(days=age))
        store.put(key, io.BytesIO(b"\x28\xb5\x2f\xfd"))
        add_team(store, key, "a")
        made[age] = key
    store.put("artifacts/inputs/0123abcd.tar.zst", io.BytesIO(b"an older layout"))
    assert sweep_inputs(store, 7, now) == 4  # the objects of days 8 and 30, and their records
    left = set(store.list("artifacts/inputs/"))
    assert left == {
        made[0],
        made[0].replace(".tar.zst", ".teams.json"),
        made[7],
        made[7].replace(".tar.zst", ".teams.json"),
        "artifacts/inputs/0123abcd.tar.zst",
    }, left
    assert sweeper(store, 7) is not None
    assert sweeper(open_store("s3://bucket/ci"), 7) is None  # its lifecycle rule's job


def test_the_shipped_lifecycle_rules_expire_inputs_after_the_sweeps_days() -> None:
    """The S3 rule is a valid PutBucketLifecycleConfiguration (botocore's own validation),
    the GCS rule what google-cloud-storage writes for the same; both expire
    ``artifacts/inputs/`` after INPUTS_TTL_DAYS' default."""
    import boto3
    from botocore.validate import validate_parameters
    from google.cloud.storage.bucket import LifecycleRuleDelete

    folder = Path(__file__).resolve().parents[2] / "knative" / "store-lifecycle"
    days = UploadLimits().inputs_ttl_days
    s3 = json.loads((folder / "s3-lifecycle.json").read_text())
    client = boto3.client(
        "s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    shape = client.meta.service_model.operation_model("PutBucketLifecycleConfiguration").input_shape
    validate_parameters({"Bucket": "b", "LifecycleConfiguration": s3}, shape)
    (rule,) = s3["Rules"]
    assert (rule["Filter"]["Prefix"], rule["Expiration"]["Days"]) == (keys.INPUTS, days)
    gcs = json.loads((folder / "gcs-lifecycle.json").read_text())
    assert gcs["rule"] == [dict(LifecycleRuleDelete(age=days, matches_prefix=[keys.INPUTS]))]


@pytest.mark.parametrize("limits", [UploadLimits(per_replica=2)], ids=["two-at-once"])
def test_one_team_never_holds_every_upload_slot(service: Service, limits: UploadLimits) -> None:
    gate, holder = slot_held(service, "a")  # team a's upload under way
    empty = b"\0" * 1024  # an empty tar
    try:
        mine = post_upload(service, "token-a", empty, "none")
        theirs = post_upload(service, "token-b", empty, "none")
    finally:
        gate.set()
        holder.join(10)
    assert mine.status_code == 429 and "as many as one team may" in mine.text
    assert theirs.status_code == 201, theirs.text


def test_an_upload_that_drips_is_dropped_and_frees_its_slot(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from functions.tekton import artifact_service

    monkeypatch.setattr(artifact_service, "RATE_GRACE_SECONDS", 0.3)

    def drip() -> Iterator[bytes]:
        yield b"\0" * 512  # a tar header block: the format's first bytes
        for _ in range(20):
            time.sleep(0.1)
            yield b"\0"

    answer = requests.post(
        service.url + "/artifacts",
        params={"format": "none"},
        headers={"Authorization": "Bearer token-a"},
        data=drip(),
        timeout=30,
    )
    assert answer.status_code == 408 and "slower than" in answer.json()["error"]["message"]
    assert inputs_of(service.store) == []
