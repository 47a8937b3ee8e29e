"""upload_tree / download_tree through every store backend (file, s3 on versitygw, gcs emulator)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import Store
from storage.archive import ArchiveOptions
from storage.artifacts import download_tree, upload_tree
from storage.store_errors import ArchiveRejected, DigestMismatch, ObjectNotFound
from tests.support.archive_trees import build_tree, describe


@pytest.mark.server
@pytest.mark.parametrize(("format", "suffix"), [("zstd", ".tar.zst"), ("gzip", ".tar.gz")])
def test_tree_survives_the_store(store: Store, tmp_path: Path, format: str, suffix: str) -> None:
    tree = build_tree(tmp_path / "tree")
    key = f"artifacts/cache-key{suffix}"

    info = upload_tree(store, key, tree, ArchiveOptions(format=format))
    stats = download_tree(store, key, tmp_path / "out", expected_digest=info.digest)

    assert describe(tmp_path / "out") == describe(tree)
    assert (stats.size, stats.digest) == (info.size, info.digest)


@pytest.mark.server
def test_download_checks_the_expected_digest(store: Store, tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "tree")
    upload_tree(store, "artifacts/k.tar.zst", tree)
    with pytest.raises(DigestMismatch):
        download_tree(
            store, "artifacts/k.tar.zst", tmp_path / "out", expected_digest="sha256:" + "0" * 64
        )


@pytest.mark.server
def test_a_pack_failure_leaves_no_object(store: Store, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a-random.bin").write_bytes(os.urandom(24 << 20))  # more than one upload part
    os.mkfifo(tree / "z-fifo")  # fails the pack after the first part went up
    with pytest.raises(ArchiveRejected, match="'z-fifo': a FIFO cannot be archived"):
        upload_tree(store, "artifacts/k.tar.zst", tree)
    assert store.stat("artifacts/k.tar.zst") is None


@pytest.mark.server
def test_download_of_a_missing_artifact(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound):
        download_tree(store, "artifacts/missing.tar.zst", tmp_path / "out")


def test_key_suffix_must_match_the_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match format 'zstd'"):
        upload_tree(None, "artifacts/k.tar.gz", tmp_path)  # type: ignore[arg-type]
