"""Command line: ``python -m functions serve|run|stage|collect|demo``."""

from __future__ import annotations

import sys

from functions.cli.commands import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
