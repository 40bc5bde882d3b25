"""The compressed variants fed a NaN on one rank: the job must stop with one clear line.

    mpiexec -n 2 python -m tests.drivers.compressed_nan p2p_compressed|coll_compressed \
        [harness options]
"""

from __future__ import annotations

import sys

import numpy as np

from ccbench.benchmarks.coll_compressed import CollCompressed
from ccbench.benchmarks.harness import run_variant
from ccbench.benchmarks.p2p_compressed import P2PCompressed


def with_nan(base):
    class NaNInput(base):
        """Rank 1's input holds one NaN."""

        def make_input(self, case, rank: int) -> np.ndarray:
            values = super().make_input(case, rank)
            if rank == 1 and values.size:
                values[values.size // 2] = np.nan
            return values

    return NaNInput()


if __name__ == "__main__":
    variants = {"p2p_compressed": P2PCompressed, "coll_compressed": CollCompressed}
    raise SystemExit(run_variant(with_nan(variants[sys.argv[1]]), sys.argv[2:]))
