"""Element-wise reduction kernels shared by every reducing collective."""

from __future__ import annotations

import numpy as np


def add_into(out, a, b) -> None:
    """out = a + b, in place, for numpy, cupy and torch arrays (bfloat16 included)."""
    if isinstance(out, np.ndarray):
        np.add(a, b, out=out)
    elif type(out).__module__.startswith("torch"):
        import torch

        torch.add(a, b, out=out)
    else:  # cupy, or another device library (its namespace's add)
        import array_api_compat

        array_api_compat.array_namespace(out).add(a, b, out=out)


def copy_into(out, a) -> None:
    """out[...] = a for numpy, cupy and torch arrays."""
    if type(out).__module__.startswith("torch"):
        out.copy_(a)
    else:
        out[...] = a


def bfloat16_sum(inbuf, inoutbuf, datatype) -> None:
    """MPI user operation: inoutbuf += inbuf on bfloat16 values carried as uint16.

    MPI has no bfloat16 type, so the library's reductions reject it; this op widens to
    float32 (exact), adds, and rounds back to nearest-even, as torch does.
    """
    a = np.frombuffer(inbuf, dtype=np.uint16)
    b = np.frombuffer(inoutbuf, dtype=np.uint16)
    total = (a.astype(np.uint32) << 16).view(np.float32) + (b.astype(np.uint32) << 16).view(
        np.float32
    )
    bits = total.view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding) >> 16).astype(np.uint16)
    rounded[np.isnan(total)] = 0x7FC0
    b[...] = rounded
