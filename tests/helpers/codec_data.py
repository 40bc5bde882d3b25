"""The codecs under test and their round trips, shared by tests/test_codecs.py and
tests/test_error_bounds.py: the lossy and lossless specs, the largest magnitude each lossy
codec carries, hypothesis's settings and float32 arrays of zeros, subnormals, tiny and
huge values."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays as np_arrays

from ccbench.kernels.codecs import parse_codec

LOSSY = [
    "fp16",
    "bf16",
    "bfp:rate=2",
    "bfp:rate=3,block=8",
    "bfp:rate=4",
    "bfp:rate=8",
    "bfp:rate=12,block=64",
    "bfp:rate=16",
    "zfp:rate=3",
    "zfp:rate=8",
    "zfp:rate=16",
    "zfp:rate=32",
    "zfp:tol=1e-3",
    "zfp:tol=1e-6",
]


LOSSLESS = ["none", "zstd", "zstd:level=5"]


ALL = LOSSY + LOSSLESS


# the largest magnitude each lossy codec carries (exclusive for bfp)
LIMIT = {"fp16": 65504.0, "bf16": 3.3895313892515355e38}


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def limit_of(spec: str) -> float:
    codec = parse_codec(spec)
    if spec in LIMIT:
        return LIMIT[spec]
    if codec.name == "bfp":
        return float(np.nextafter(np.float32(2.0**codec.max_exponent), np.float32(0)))
    if codec.name == "zfp":
        return float(np.nextafter(np.float32(2.0**120), np.float32(0)))
    return float(np.finfo(np.float32).max)


def roundtrip(codec, x, out_dtype=None):
    payload = codec.encode(x)
    out = np.empty(x.shape[0], dtype=out_dtype or x.dtype)
    codec.decode(payload, out)
    return payload, out


def max_err(x, y) -> float:
    return (
        float(np.abs(np.asarray(y, np.float64) - np.asarray(x, np.float64)).max())
        if x.size
        else 0.0
    )


def float32_arrays(limit: float):
    elements = st.floats(
        min_value=-limit, max_value=limit, width=32, allow_nan=False, allow_subnormal=True
    )
    special = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.2e-38, 1e-30, 1.0, limit, -limit])
    return np_arrays(np.float32, st.integers(1, 700), elements=st.one_of(elements, special))
