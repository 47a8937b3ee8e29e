"""The command line (``python -m functions``): ``commands`` parses and dispatches; ``local``
runs one action in this process; ``demo`` and ``busybox_image`` are for development only
and stay out of the production image (.dockerignore)."""

from functions.cli.commands import main

__all__ = ["main"]
