"""What the tests of every tier share: helpers, test images, and the harness pieces that
are not servers (those are in ``testbed/``)."""
