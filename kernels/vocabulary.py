"""The words every layer of ccbench shares, defined once: collectives, buffers, dtypes, sizes.

This module sits at the bottom of the house with `kernels.errors`: it imports nothing of
ccbench, and everything above may import it.
"""

from __future__ import annotations

COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")
BUFFERS = ("numpy", "torch", "cupy", "torch-cuda")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")

# What a hierarchical design (`--hierarchy node`, `--hierarchy leader`) puts before a
# row's `algorithm`; flat rows carry no mark.
HIERARCHY_MARKS = {"node": "hierarchical-", "leader": "leaders-"}

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}

# The position that travels with every sparse block (an int32).
SPARSE_INDEX_BYTES = 4

# Validation inputs are integers in [-a, a]; every partial sum over P ranks must stay an
# integer that int8 and bfloat16 hold exactly (|sum| <= 127).
_EXACT_SUM_LIMIT = 127
_EXACT_AMPLITUDE_MAX = 8


def itemsize(dtype: str) -> int:
    """Bytes per element of a DTYPES name."""
    return _ITEMSIZE[dtype]


def dtype_name(x) -> str:
    """The DTYPES name of an array of any backend ('torch.float32' -> 'float32')."""
    return str(x.dtype).rsplit(".", 1)[-1]


def nbytes(x) -> int:
    """Bytes held by a numpy, torch or cupy array."""
    if hasattr(x, "element_size"):  # torch
        return x.numel() * x.element_size()
    return int(x.nbytes)


def exact_amplitude(ranks: int) -> int:
    """Largest |value| of validation inputs on `ranks` ranks: sums stay exact in int8."""
    return max(1, min(_EXACT_AMPLITUDE_MAX, _EXACT_SUM_LIMIT // ranks))
