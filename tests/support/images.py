"""The test resource images: busybox plus the scripts in tests/support/images/<name>."""

from __future__ import annotations

from pathlib import Path

from functions.cli.busybox_image import build_resource_image

SCRIPTS = Path(__file__).parent / "images" / "test-resource"


def build_test_resource(name: str = "localhost/rf-test-resource") -> str:
    return build_resource_image(name, SCRIPTS)


def build_warm_resource(name: str = "localhost/rf-warm-resource") -> str:
    """A check that counts its runs in $TMPDIR: tests/support/images/warm-resource."""
    return build_resource_image(name, SCRIPTS.parent / "warm-resource")
