"""Seeded block-sparse inputs for the sparse-streaming benchmark (host numpy arrays).

A density d means exactly round(d * nblocks) non-zero blocks on every rank. Which blocks:

- ``random``: chosen at random per rank (seeded by seed and rank), as in OmniReduce's
  micro-benchmarks;
- ``all``: the same blocks on every rank (full overlap, union density = d);
- ``none``: disjoint blocks (a shared random permutation cut into per-rank runs); when
  d > 1/P the runs wrap around, so the overlap is the smallest possible.

Values are exactly summable: sign * {1, 2, 3, 4} * 2**-s with s in {0, 1, 2} drawn per
block, so every element of a non-zero block is non-zero and every partial sum of up to
16 ranks is a multiple of 1/4 no larger than 64, exact in float32, float64, float16 and
bfloat16 whatever the summation order. The per-block scale gives thresholds something
to drop: a block's max |x| is at most 4, 2 or 1.
"""

from __future__ import annotations

import numpy as np

from ccbench.kernels.errors import UsageError

OVERLAP_MODES = ("random", "all", "none")
# OmniReduce's micro-benchmark densities (the paper's nine), `--density paper`
PAPER_DENSITIES = (1.0, 0.8, 0.4, 0.2, 0.1, 0.08, 0.04, 0.02, 0.01)

# seed streams, so the block choice and the values never share random numbers
_CHOICE, _SHARED, _VALUES = 1, 2, 3


def blocks_for_density(nblocks: int, density: float) -> int:
    """The exact number of non-zero blocks for a density in [0, 1]."""
    if not 0.0 <= density <= 1.0:
        raise UsageError(f"density must be in [0, 1], got {density}")
    return int(round(density * nblocks))


def choose_blocks(
    nblocks: int, nnz: int, overlap: str, rank: int, nranks: int, seed: int = 0
) -> np.ndarray:
    """Sorted ids of the nnz non-zero blocks of `rank` (one of nranks data ranks)."""
    if overlap not in OVERLAP_MODES:
        raise UsageError(f"--overlap must be one of {', '.join(OVERLAP_MODES)}, got {overlap!r}")
    if overlap == "random":
        rng = np.random.default_rng([seed, _CHOICE, rank])
        ids = rng.choice(nblocks, size=nnz, replace=False)
    elif overlap == "all":
        rng = np.random.default_rng([seed, _SHARED])
        ids = rng.choice(nblocks, size=nnz, replace=False)
    else:
        perm = np.random.default_rng([seed, _SHARED]).permutation(nblocks)
        ids = perm[(rank * nnz + np.arange(nnz)) % max(nblocks, 1)]
    return np.sort(ids).astype(np.int64)


def block_values(nnz: int, block_size: int, rank: int, seed: int = 0) -> np.ndarray:
    """(nnz, block_size) float32 exactly-summable non-zero values (see module doc)."""
    rng = np.random.default_rng([seed, _VALUES, rank])
    magnitude = rng.integers(1, 5, size=(nnz, block_size), dtype=np.int8).astype(np.float32)
    sign = rng.integers(0, 2, size=(nnz, block_size), dtype=np.int8).astype(np.float32)
    scale = np.ldexp(np.float32(1), -rng.integers(0, 3, size=(nnz, 1))).astype(np.float32)
    magnitude *= scale
    magnitude *= 1 - 2 * sign
    return magnitude


def sparse_input(
    count: int, block_size: int, density: float, overlap: str, rank: int, nranks: int, seed: int = 0
) -> np.ndarray:
    """The float32 input of one data rank: exactly round(density * nblocks) non-zero blocks."""
    if block_size < 1:
        raise UsageError(f"--block-size must be at least 1, got {block_size}")
    nblocks = -(-count // block_size)
    nnz = blocks_for_density(nblocks, density)
    ids = choose_blocks(nblocks, nnz, overlap, rank, nranks, seed)
    values = block_values(nnz, block_size, rank, seed)
    x = np.zeros(count, dtype=np.float32)
    nfull = count // block_size
    full = x[: nfull * block_size].reshape(nfull, block_size)
    in_full = ids < nfull
    full[ids[in_full]] = values[in_full]
    if not in_full.all():  # the partial tail block was chosen: it is the last id
        tail = count - nfull * block_size
        x[nfull * block_size :] = values[-1, :tail]
    return x
