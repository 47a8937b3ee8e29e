"""Benchmarks inside the test tiers (the ``bench`` marker): tests whose figures decide nothing.
CI runs them at a smoke size, enough for their code and the behaviours they also assert to
keep working; ``RF_BENCH=full`` runs them at the size bench/README.md reports.

    full_size()                 whether RF_BENCH=full
    size(name, full, smoke)     $name if set, else the full or the smoke size
"""

from __future__ import annotations

import os


def full_size() -> bool:
    return os.environ.get("RF_BENCH", "") == "full"


def size(name: str, full: int, smoke: int) -> int:
    """A figure's size knob: the environment's ``name`` wins; else full or smoke."""
    given = os.environ.get(name)
    return int(given) if given else (full if full_size() else smoke)
