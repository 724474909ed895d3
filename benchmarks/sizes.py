"""`make bench QUICK=1` (``benchmarks/run.py --quick``): every benchmark at a size that
runs in seconds. Its figures are not the issues' (they are printed all the same); it
shows that each benchmark still runs, so `make test-full` runs it."""

from __future__ import annotations

import os

VARIABLE = "SLURM_BURST_BENCH_QUICK"
QUICK = os.environ.get(VARIABLE) == "1"


def size(full: int, quick: int) -> int:
    """``full``, or ``quick`` in a quick run."""
    return quick if QUICK else full
