"""The demo finds its example resource type wherever its module sits in the package."""

from functions.cli.demo import EXAMPLE


def test_the_demo_example_resource_type_is_found():
    assert {"check", "in", "out"} <= {p.name for p in EXAMPLE.iterdir()}
