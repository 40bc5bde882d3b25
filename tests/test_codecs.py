"""Codecs in one process: spec parsing, sizes, payloads, rounding, round trips.

Property tests (hypothesis) feed zeros, subnormals, tiny and huge values; lossless codecs
must return the same bits, and values a codec cannot carry must raise DataError instead
of coming back corrupted. Lossy codecs against their stated bounds:
tests/test_error_bounds.py.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays as np_arrays

from ccbench.kernels.codec_base import HEADER_NBYTES
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError, UsageError
from tests.helpers.codec_data import (
    ALL,
    LOSSLESS,
    LOSSY,
    PROPERTY,
    roundtrip,
)

torch = pytest.importorskip("torch")
zfpy = pytest.importorskip("zfpy")
pytest.importorskip("zstandard")


# ---------------------------------------------------------------- spec parser


@pytest.mark.parametrize(
    "spec, canonical",
    [
        ("fp16", "fp16"),
        ("BF16", "bf16"),
        ("bfp:rate=8", "bfp:rate=8"),
        ("bfp:rate=8,block=32", "bfp:rate=8"),
        ("bfp: block=64 , rate=4", "bfp:rate=4,block=64"),
        ("zfp:rate=16", "zfp:rate=16"),
        ("zfp:tol=0.001", "zfp:tol=0.001"),
        ("zstd", "zstd"),
        ("zstd:level=1", "zstd"),
        ("zstd:level=9", "zstd:level=9"),
        ("none", "none"),
    ],
)
def test_canonical_spec(spec, canonical):
    assert parse_codec(spec).spec == canonical


@pytest.mark.parametrize(
    "spec, words",
    [
        ("gzip", "unknown codec"),
        ("", "unknown codec"),
        ("bfp", "needs rate"),
        ("bfp:rate=1", "rate must be an integer in 2..16"),
        ("bfp:rate=17", "2..16"),
        ("bfp:rate=eight", "2..16"),
        ("bfp:rate=8,block=12", "multiple of 8"),
        ("bfp:rate=8,block=512", "8..256"),
        ("bfp:rate=8,rate=4", "given twice"),
        ("bfp:rate=8,foo=1", "unknown parameter"),
        ("fp16:rate=8", "unknown parameter"),
        ("zfp", "exactly one of"),
        ("zfp:rate=8,tol=1e-3", "exactly one of"),
        ("zfp:rate=2", "3..32"),
        ("zfp:rate=33", "3..32"),
        ("zfp:tol=0", "positive"),
        ("zfp:tol=-1", "positive"),
        ("zfp:tol=nan", "positive"),
        ("zstd:level=23", "-7..22"),
        ("bfp:rate", "unknown parameter"),
    ],
)
def test_bad_specs_raise_usage_error(spec, words):
    with pytest.raises(UsageError, match=words):
        parse_codec(spec)


def test_unsupported_buffers_and_dtypes():
    with pytest.raises(UsageError, match="int8"):
        parse_codec("fp16").check_supported("numpy", "int8")
    for spec in ("zfp:rate=8", "zfp:tol=1e-3", "zstd"):
        with pytest.raises(UsageError, match="CPU only"):
            parse_codec(spec).check_supported("torch-cuda", "float32")
    parse_codec("bfp:rate=8").check_supported("torch-cuda", "bfloat16")  # namespace code


# ---------------------------------------------------------------- sizes and payloads


@pytest.mark.parametrize("spec", ALL)
@pytest.mark.parametrize("count", [1, 3, 4, 31, 32, 257, 8192, 8193, 20000])
def test_payload_is_contiguous_uint8_of_stated_size(spec, count):
    codec = parse_codec(spec)
    x = np.random.default_rng(count).standard_normal(count).astype(np.float32)
    payload, y = roundtrip(codec, x)
    assert payload.dtype == np.uint8 and payload.ndim == 1 and payload.flags.c_contiguous
    if codec.fixed_size:
        assert payload.shape[0] == codec.encoded_nbytes(count, "float32")
    else:
        assert codec.encoded_nbytes(count, "float32") is None
        assert payload.shape[0] <= codec.max_encoded_nbytes(count, "float32")
        assert codec.payload_nbytes(payload, count) == payload.shape[0]
    # into a preallocated (larger) buffer: the payload is a view of it
    buf = np.full(codec.max_encoded_nbytes(count, "float32") + 16, 7, np.uint8)
    again = codec.encode(x, out=buf)
    assert np.shares_memory(again, buf) and np.array_equal(again, payload)
    out = np.empty_like(x)
    codec.decode(buf, out)  # trailing bytes after the payload are ignored
    assert np.array_equal(out, y)


@pytest.mark.parametrize(
    "spec, dtype, ratio",
    [
        ("fp16", "float32", 2.0),
        ("bf16", "float64", 4.0),
        ("bfp:rate=8", "float32", 32 / 8.25),
        ("bfp:rate=4,block=64", "float32", 32 / 4.125),
        ("bfp:rate=16", "float16", 16 / 16.25),
        ("zfp:rate=8", "float32", 4.0),
        ("zfp:rate=16", "float64", 4.0),
        ("none", "float32", 1.0),
    ],
)
def test_nominal_ratio(spec, dtype, ratio):
    assert parse_codec(spec).nominal_ratio(dtype) == pytest.approx(ratio, rel=1e-6)


def test_bfp_size_formula():
    codec = parse_codec("bfp:rate=5,block=16")
    for count in (1, 15, 16, 17, 4096, 4097, 100000):
        assert codec.encoded_nbytes(count) == math.ceil(count / 16) * (1 + 16 * 5 // 8)


@pytest.mark.parametrize("spec", ["bfp:rate=8", "bfp:rate=5", "bfp:rate=16"])
@pytest.mark.parametrize("count", [5, 8192, 8200])
def test_numpy_and_torch_give_the_same_payload(spec, count):
    codec = parse_codec(spec)
    x = np.random.default_rng(1).standard_normal(count).astype(np.float32)
    p_np = codec.encode(x)
    p_t = codec.encode(torch.from_numpy(x.copy()))
    assert isinstance(p_t, torch.Tensor) and p_t.dtype == torch.uint8
    assert np.array_equal(p_t.numpy(), p_np)
    out = torch.empty(count)
    codec.decode(p_t, out)
    y = np.empty_like(x)
    codec.decode(p_np, y)
    assert np.array_equal(out.numpy(), y)


# ---------------------------------------------------------------- the cast codecs, bit for bit

# (significant bits, exponent of the smallest normal as frexp gives it) of the 2-byte types
CAST_FORMATS = {"fp16": (11, -13), "bf16": (8, -125)}


def nearest_even(x32: np.ndarray, spec: str) -> np.ndarray:
    """float32 values rounded to fp16 / bf16, nearest even, as 16-bit patterns: worked in
    float64, where x / step is exact and np.round breaks ties to even (no cast library)."""
    bits, min_exp = CAST_FORMATS[spec]
    x = x32.astype(np.float64)
    exponent = np.maximum(np.frexp(x)[1], min_exp)  # below the normals the step is fixed
    step = np.ldexp(1.0, exponent - bits)
    rounded = np.round(x / step) * step
    if spec == "fp16":
        return rounded.astype(np.float16).view(np.uint16)
    return (rounded.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture
def without_torch(monkeypatch):
    """The cast codecs as on a host without torch: `import torch` fails for them."""
    from ccbench.kernels import codec_cast

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(codec_cast, "_torch", None)  # forget an earlier successful import


def cast_inputs(spec: str) -> np.ndarray:
    """Ties in both directions, subnormals, signed zeros and random values of every scale."""
    bits, min_exp = CAST_FORMATS[spec]
    ulp = 2.0 ** (1 - bits)  # between 1 and 2
    ties = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 3 * 2.0 ** (min_exp - bits - 1)]
    near = [1 + ulp / 2 + 2.0**-23, 1 + ulp / 2 - 2.0**-23, 0.0, -0.0, 1e-45, -3e-41, 5e-39]
    rng = np.random.default_rng(5)
    spread = rng.standard_normal(4000) * 2.0 ** rng.integers(-40, 14, 4000)
    return np.concatenate([ties, near, spread]).astype(np.float32)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_cast_codecs_without_torch_round_to_nearest_even(spec, without_torch):
    codec = parse_codec(spec)
    x = cast_inputs(spec)
    payload = codec.encode(x)
    assert isinstance(payload, np.ndarray)
    expected = nearest_even(x, spec)
    got = payload.view(np.uint16)
    assert np.array_equal(got, expected), np.flatnonzero(got != expected)[:5]
    out = np.empty_like(x)
    codec.decode(payload, out)
    if spec == "fp16":
        wide = expected.view(np.float16).astype(np.float32)
    else:
        wide = (expected.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(out.view(np.uint32), wide.view(np.uint32))


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
@PROPERTY
@given(
    x=np_arrays(
        np.float32,
        st.integers(1, 500),
        elements=st.floats(
            min_value=-60000, max_value=60000, width=32, allow_nan=False, allow_subnormal=True
        ),
    )
)
def test_cast_codecs_without_torch_property(spec, x):
    from ccbench.kernels import codec_cast

    saved = codec_cast._torch  # torch is imported above: sys.modules holds it
    sys.modules["torch"], codec_cast._torch = None, None  # hypothesis runs outside fixtures
    try:
        payload = parse_codec(spec).encode(x)
    finally:
        sys.modules["torch"], codec_cast._torch = torch, saved
    assert np.array_equal(payload.view(np.uint16), nearest_even(x, spec))


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_cast_codecs_with_torch_round_to_nearest_even(spec):
    """numpy arrays borrow torch's kernels, torch tensors use them: the same bits."""
    codec = parse_codec(spec)
    x = cast_inputs(spec)
    expected = nearest_even(x, spec)
    assert np.array_equal(codec.encode(x).view(np.uint16), expected)
    assert np.array_equal(
        codec.encode(torch.from_numpy(x.copy())).numpy().view(np.uint16), expected
    )


def test_bfp_unaligned_torch_payload():
    """A 16-bit plane at an odd offset (torch cannot view it as int16) still works."""
    codec = parse_codec("bfp:rate=16")
    x = torch.randn(9000)
    buf = torch.zeros(codec.encoded_nbytes(9000) + 1, dtype=torch.uint8)
    payload = codec.encode(x, out=buf[1:])
    assert torch.equal(payload, codec.encode(x))
    out = torch.empty(9000)
    codec.decode(payload, out)
    assert (out - x).abs().max().item() <= codec.error_bound(x.abs().max().item())


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "zfp:rate=8", "zstd", "none"])
@pytest.mark.parametrize("dtype", ["float16", "float64", "bfloat16"])
def test_other_dtypes(spec, dtype):
    codec = parse_codec(spec)
    values = np.random.default_rng(2).standard_normal(3000)
    if dtype == "bfloat16":
        x = torch.from_numpy(values).to(torch.bfloat16)
        out = torch.empty_like(x)
    else:
        x = values.astype(dtype)
        out = np.empty_like(x)
    codec.decode(codec.encode(x), out)
    held = np.asarray(x.float() if dtype == "bfloat16" else x, np.float64)
    got = np.asarray(out.float() if dtype == "bfloat16" else out, np.float64)
    err = float(np.abs(got - held).max())
    if codec.lossy:
        assert err <= codec.error_bound(float(np.abs(held).max()), dtype)
    else:
        assert err == 0


def test_variable_size_header():
    codec = parse_codec("zstd")
    x = np.zeros(1000, np.float32)
    payload = codec.encode(x)
    body = int.from_bytes(payload[:HEADER_NBYTES].tobytes(), "little")
    assert body == payload.shape[0] - HEADER_NBYTES
    assert payload.shape[0] < x.nbytes / 10  # zeros compress


# ---------------------------------------------------------------- bad data


@pytest.mark.parametrize("spec", LOSSY)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_raise_data_error(spec, bad):
    codec = parse_codec(spec)
    x = np.ones(10000, np.float32)
    x[7777] = bad
    with pytest.raises(DataError, match="NaN|Inf"):
        codec.encode(x)


@pytest.mark.parametrize(
    "spec, value",
    [
        ("fp16", 70000.0),
        ("fp16", -1e6),
        ("bfp:rate=8", 2.0**110),
        ("bfp:rate=2", -(2.0**104)),
        ("zfp:rate=3", 3e38),
        ("zfp:tol=1", -(2.0**121)),
    ],
)
def test_out_of_range_raises_data_error(spec, value):
    x = np.zeros(100, np.float32)
    x[3] = value
    with pytest.raises(DataError):
        parse_codec(spec).encode(x)
    with pytest.raises(DataError):
        parse_codec(spec).encode(torch.from_numpy(x))


@pytest.mark.parametrize("spec", LOSSLESS)
def test_lossless_keeps_nan_inf_bits(spec):
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38], np.float32)
    _, y = roundtrip(parse_codec(spec), x)
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("spec", LOSSLESS)
@PROPERTY
@given(x=np_arrays(np.float32, st.integers(1, 700)))
def test_lossless_roundtrip_is_bit_exact(spec, x):
    _, y = roundtrip(parse_codec(spec), x)
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
