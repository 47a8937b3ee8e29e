"""Generated git histories of a given size, for the warm check figures (``bench/warm_check.py``,
``tests/cluster/test_warm_pods.py``).

    make_repository(bare, megabytes, shape)   a bare repository of about that much history
    add_commit(bare, n)                       one new small commit on ``main``
"""

from __future__ import annotations

import os
import random
import string
import subprocess
from collections.abc import Iterator
from pathlib import Path


def make_repository(bare: Path, megabytes: int, shape: str) -> None:
    """A bare repository of about ``megabytes`` of history on ``main`` (git fast-import).

    ``source``: a source tree's history, 1,000 text files in 50 folders, each commit editing
    a few of them (lines inserted or replaced, words drawn from a vocabulary): many objects,
    blobs stored as deltas of their previous version, as a real repository's history is, so a
    clone does a real repository's work (objects counted, deltas resolved, a tree checked
    out); about 25 commits per MiB of pack. ``random``: one commit per MiB of random data
    (one object per commit, nothing to resolve): the cheapest history of that size to clone.
    """
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    importer = subprocess.Popen(["git", "fast-import", "--quiet"], stdin=subprocess.PIPE, cwd=bare)
    assert importer.stdin is not None
    commits = megabytes * 25 if shape == "source" else megabytes
    edits = source_edits(random.Random(1)) if shape == "source" else None
    for i in range(commits):
        message = f"history {i}\n".encode()
        importer.stdin.write(b"commit refs/heads/main\n")
        importer.stdin.write(b"committer t <t@example.com> %d +0000\n" % (1_700_000_000 + i))
        importer.stdin.write(b"data %d\n%s" % (len(message), message))
        changed = next(edits) if edits else {f"data/{i}.bin": os.urandom(1 << 20)}
        for path, blob in changed.items():
            importer.stdin.write(b"M 100644 inline %s\ndata %d\n" % (path.encode(), len(blob)))
            importer.stdin.write(blob + b"\n")
    importer.stdin.close()
    if importer.wait():
        raise RuntimeError("git fast-import failed")


def source_edits(rng: random.Random, files: int = 1000) -> Iterator[dict[str, bytes]]:
    """Each commit's changed files (path -> content): all of them first, then 5 at a time."""
    vocabulary = ["".join(rng.choices(string.ascii_lowercase + "_", k=rng.randint(2, 10)))
                  for _ in range(5000)]  # fmt: skip

    def line() -> str:
        return " ".join(rng.choices(vocabulary, k=rng.randint(3, 12)))

    content = {f: [line() for _ in range(rng.randint(50, 400))] for f in range(files)}

    def as_file(f: int) -> tuple[str, bytes]:
        return f"src/m{f % 50}/f{f}.py", ("\n".join(content[f]) + "\n").encode()

    yield dict(as_file(f) for f in range(files))
    while True:
        edited = {rng.randrange(files) for _ in range(5)}
        for f in edited:
            lines = content[f]
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(lines) + 1)
                if rng.random() < 0.6 or not lines:
                    lines.insert(at, line())
                else:
                    lines[min(at, len(lines) - 1)] = line()
        yield dict(as_file(f) for f in edited)


def add_commit(bare: Path, n: int) -> None:
    """One new small commit on ``main``."""
    message = f"new {n}\n".encode()
    body = f"new commit {n}\n".encode()
    stream = (
        b"commit refs/heads/main\ncommitter t <t@example.com> %d +0000\n" % (1_800_000_000 + n)
        + b"data %d\n%s" % (len(message), message)
        + b"from refs/heads/main^0\n"
        + b"M 100644 inline new.txt\ndata %d\n%s\n" % (len(body), body)
    )
    subprocess.run(["git", "fast-import", "--quiet"], input=stream, cwd=bare, check=True)
