"""The test resource image: busybox plus the scripts in tests/support/images/test-resource."""

from __future__ import annotations

from pathlib import Path

from functions.cli.busybox_image import build_resource_image

SCRIPTS = Path(__file__).parent / "images" / "test-resource"


def build_test_resource(name: str = "localhost/rf-test-resource") -> str:
    return build_resource_image(name, SCRIPTS)
