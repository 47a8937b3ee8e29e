"""A put's inputs are verified against the digest recorded for them, even when the request
names only the URL: a tampered artifact is refused, on every store backend."""
import io

import pytest

from functions.model import ArtifactRef
from functions.task.steps import StageFailed, known_digest, stage
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
    put_json(store, "artifacts/" + "c" * 64 + ".json", {"artifact": {
        "url": store.url_for(key), "digest": info.digest, "size": info.size}})
    return key, info


def test_the_cache_record_supplies_the_digest(store, artifact):
    key, info = artifact
    assert known_digest(store, key) == info.digest


def test_a_replaced_artifact_is_refused(store, artifact, tmp_path):
    key, _ = artifact
    store.delete(key)
    other = tmp_path / "other"
    other.mkdir()
    (other / "version").write_text("evil\n")
    upload_tree(store, key, other)
    with pytest.raises(StageFailed, match="digest mismatch"):
        stage(store, {"repo": ArtifactRef(key)}, tmp_path / "work", Limits())


def test_an_artifact_without_record_uses_what_the_store_knows(store, tmp_path):
    key = "artifacts/inputs/x.tar"
    store.put(key, io.BytesIO(b"\0" * 1024))
    info = store.stat(key)
    assert known_digest(store, key) == (info.digest if info else None)
