"""How close a collective's result is to the exact one, measured on the timed data.

Each rank reduces its own part to a few sums (`partial_sums`); the sums of all ranks
combine (`combine`) into the row's accuracy columns, over the whole result of every rank:

    rel_l2_err   ||y - x|| / ||x||                (x the exact result, y the measured one)
    max_abs_err  max |y - x|
    max_rel_err  max |y - x| / max |x|
    psnr_db      20 log10(max |x| / rms(y - x))   (inf when y = x)
    cosine       <y, x> / (||y|| ||x||)           (gradient data only: the direction an
                                                   optimizer follows)

x is the float64 sum of every rank's input as the buffers hold it, so an uncompressed
float32 collective shows the rounding of its own summation order, and nothing more.
"""

from __future__ import annotations

import math

import numpy as np

ACCURACY_COLUMNS = ("rel_l2_err", "max_abs_err", "max_rel_err", "psnr_db", "cosine")

# partial sums: squared error, squared reference, <y, x>, squared result, count, then
# the maxima: |error|, |reference|, and 1 if anything is not finite
_SUMS, _MAXES = 5, 3


def partial_sums(result: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """This rank's contribution: 5 sums then 3 maxima (float64)."""
    y = np.asarray(result, dtype=np.float64)
    x = np.asarray(reference, dtype=np.float64)
    finite = bool(np.isfinite(y).all())
    err = y - x if finite else np.zeros_like(x)
    return np.array(
        [
            float(err @ err),
            float(x @ x),
            float(y @ x) if finite else 0.0,
            float(y @ y) if finite else 0.0,
            float(x.size),
            float(np.abs(err).max()) if err.size else 0.0,
            float(np.abs(x).max()) if x.size else 0.0,
            0.0 if finite else 1.0,
        ]
    )


def combine(sums: np.ndarray, maxima: np.ndarray, gradient: bool) -> dict:
    """The accuracy columns from the element-wise sum of every rank's first five partial
    sums and the element-wise maximum of their last three."""
    sq_err, sq_ref, dot, sq_got, count = (float(v) for v in sums)
    max_err, max_ref, nonfinite = (float(v) for v in maxima)
    if nonfinite:
        return dict.fromkeys(ACCURACY_COLUMNS, math.inf) | {
            "cosine": None if not gradient else math.nan
        }
    rel_l2 = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else (0.0 if sq_err == 0 else math.inf)
    rms = math.sqrt(sq_err / count) if count else 0.0
    psnr = math.inf if rms == 0 else (20 * math.log10(max_ref / rms) if max_ref > 0 else -math.inf)
    cosine = None
    if gradient:
        norm = math.sqrt(sq_got * sq_ref)
        cosine = dot / norm if norm > 0 else (1.0 if sq_got == sq_ref == 0 else 0.0)
    return {
        "rel_l2_err": rel_l2,
        "max_abs_err": max_err,
        "max_rel_err": max_err / max_ref if max_ref > 0 else max_err,
        "psnr_db": psnr,
        "cosine": cosine,
    }


def split(partial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return partial[:_SUMS], partial[_SUMS : _SUMS + _MAXES]
