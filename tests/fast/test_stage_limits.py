"""ARCHIVE_MAX_TOTAL_BYTES / ARCHIVE_MAX_ENTRIES bound a whole put, all its inputs together
(the same artifact named three times must not extract three times the limit)."""

from __future__ import annotations

import pytest

from functions.model import ArtifactRef
from functions.steps import stage_collect
from storage import open_store
from storage.archive import ArchiveOptions, Limits
from storage.artifacts import upload_tree


@pytest.fixture
def artifact(tmp_path):
    (tmp_path / "store").mkdir()
    store = open_store((tmp_path / "store").as_uri())
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "blob").write_bytes(b"\0" * 400_000)  # compresses to almost nothing, like a bomb
    upload_tree(store, "artifacts/bomb.tar.zst", tree, ArchiveOptions())
    return store, ArtifactRef(key="artifacts/bomb.tar.zst")


def test_the_total_limit_spans_all_inputs_of_a_put(artifact, tmp_path):
    store, ref = artifact
    limits = Limits(max_total_bytes=1_000_000)
    work = tmp_path / "one"
    stage_collect.stage(store, {"a": ref, "b": ref}, work, limits)  # 800 KB: within the bound
    with pytest.raises(stage_collect.StageFailed, match="together"):
        stage_collect.stage(store, {"a": ref, "b": ref, "c": ref}, tmp_path / "two", limits)


def test_the_entry_limit_spans_all_inputs_of_a_put(artifact, tmp_path):
    store, ref = artifact
    with pytest.raises(stage_collect.StageFailed):
        stage_collect.stage(
            store, {"a": ref, "b": ref, "c": ref}, tmp_path / "w", Limits(max_entries=2)
        )
