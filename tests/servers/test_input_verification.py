"""A put's inputs are verified against the digest recorded for them, even when the request
names only the URL: a tampered artifact is refused, on every store backend."""

import hashlib
import io

import pytest

from functions.model import ArtifactRef
from functions.steps.stage_collect import StageFailed, known_digest, stage
from storage import put_json
from storage.archive import Limits
from storage.artifacts import upload_tree


@pytest.fixture
def artifact(store, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "version").write_text("1\n")
    key = "artifacts/" + "c" * 64 + ".tar.zst"
    info = upload_tree(store, key, tree)
    put_json(
        store,
        "artifacts/" + "c" * 64 + ".json",
        {"artifact": {"url": store.url_for(key), "digest": info.digest, "size": info.size}},
    )
    return key, info


def test_the_cache_record_supplies_the_digest(store):
    key = "artifacts/" + "f" * 64 + ".tar"
    store.put(key, io.BytesIO(b"bytes"))
    recorded = "sha256:" + "1" * 64  # not the bytes' digest: only the record can say it
    put_json(
        store,
        "artifacts/" + "f" * 64 + ".json",
        {"artifact": {"url": store.url_for(key), "digest": recorded, "size": 5}},
    )
    assert known_digest(store, key) == recorded


def test_a_replaced_artifact_is_refused(store, artifact, tmp_path):
    key, _ = artifact
    store.delete(key)
    other = tmp_path / "other"
    other.mkdir()
    (other / "version").write_text("evil\n")
    upload_tree(store, key, other)
    with pytest.raises(StageFailed, match="digest mismatch"):
        stage(store, {"repo": ArtifactRef(key)}, tmp_path / "work", Limits())


def test_an_artifact_without_record_is_checked_against_its_bytes(store):
    key = "artifacts/inputs/x.tar"
    payload = b"\0" * 1024
    store.put(key, io.BytesIO(payload))
    assert known_digest(store, key) == "sha256:" + hashlib.sha256(payload).hexdigest()


def test_a_record_naming_another_artifact_is_not_trusted(store, artifact):
    key, info = artifact
    other = "artifacts/" + "d" * 64 + ".tar.zst"
    stem = other.removesuffix(".tar.zst")
    put_json(
        store,
        stem + ".json",
        {"artifact": {"url": store.url_for(key), "digest": info.digest, "size": info.size}},
    )
    store.put(other, io.BytesIO(b"not the recorded artifact"))
    expected = "sha256:" + hashlib.sha256(b"not the recorded artifact").hexdigest()
    assert known_digest(store, other) == expected != info.digest


def test_a_missing_artifact_has_no_digest(store):
    assert known_digest(store, "artifacts/" + "e" * 64 + ".tar.zst") is None


def test_an_intact_artifact_is_staged(store, artifact, tmp_path):
    key, _ = artifact
    stage(store, {"repo": ArtifactRef(key)}, tmp_path / "work", Limits())
    assert (tmp_path / "work" / "repo" / "version").read_text() == "1\n"
