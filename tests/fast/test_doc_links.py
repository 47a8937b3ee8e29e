"""Every relative link of the documents leads somewhere: the file exists and, where the link
names a section, that heading is there (as GitHub turns headings into anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "tests").rglob("README.md"),
        ROOT / "bench" / "README.md",
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = FENCE.sub("", document.read_text())
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links(document: Path) -> list[str]:
    found = LINK.findall(FENCE.sub("", document.read_text()))
    return [link for link in found if not re.match(r"[a-z]+:", link)]


def test_the_anchor_rule() -> None:
    assert anchor(" Deploy on Kubernetes") == "deploy-on-kubernetes"
    assert anchor(" The check in the function") == "the-check-in-the-function"
    assert anchor(" `ARCHIVE_LEVEL=auto`: levels, and why") == "archive_levelauto-levels-and-why"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for link in links(document):
        path, _, section = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            broken.append(f"{link}: no {target.relative_to(ROOT)}")
        elif section and target.suffix == ".md" and section not in anchors(target):
            broken.append(f"{link}: no heading #{section} in {target.relative_to(ROOT)}")
    assert broken == []
