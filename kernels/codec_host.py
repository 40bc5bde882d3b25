"""Codecs backed by CPU libraries: ZFP (zfpy) and byte-shuffle + zstd (zstandard).

They take numpy arrays and torch CPU tensors (through zero-copy numpy views); GPU
buffers are refused at set-up (`check_supported`). float16 and bfloat16 data go
through float32 for ZFP, which only knows float32 and float64.

ZFP codecs take finite |x| < 2**120 (float32 data) or 2**1016 (float64), so that the
decoded values stay finite; anything else raises DataError. Values below 2**-97
(2**-960) are flushed to zero first: ZFP's scale factor overflows for such blocks.

* `zfp:rate=R`: ZFP's fixed-rate mode, R bits per value (3..32; zfpy corrupts memory
  below 3 bits for 1-D float arrays). 1-D blocks of 4 values, each 4R bits, the stream
  padded to 64-bit words: ceil(ceil(n/4) * 4R / 64) * 8 bytes, no header.
* `zfp:tol=E`: ZFP's fixed-accuracy mode, |error| <= E; variable size.
* `zstd:level=L`: lossless, bytes of each value regrouped by significance (byte
  shuffle, as Blosc does) then zstd; variable size. Stands in for MPC.

Variable-size payloads carry an 8-byte length header (see kernels/codec_base.py).
"""

from __future__ import annotations

import math

import numpy as np

from ccbench.kernels.codec_base import Codec, dtype_name, host_numpy
from ccbench.kernels.errors import DataError, UsageError
from ccbench.kernels.vocabulary import itemsize

_ZFP_HEADER_BITS = 148  # ZFP_HEADER_MAX_BITS: slack for the stream's own bookkeeping


def _zfpy():
    try:
        import zfpy
    except ImportError:
        raise UsageError(
            "zfp codecs need the zfpy package (pip install 'ccbench[codecs]')"
        ) from None
    return zfpy


def _zstandard():
    try:
        import zstandard
    except ImportError:
        raise UsageError(
            "the zstd codec needs the zstandard package (pip install 'ccbench[codecs]')"
        ) from None
    return zstandard


def _work_dtype(dtype: str):
    """The dtype ZFP compresses `dtype` data as."""
    return np.float64 if dtype == "float64" else np.float32


def _as_work(x) -> np.ndarray:
    """x as a contiguous float32/float64 numpy array (a view when it already is one)."""
    name = dtype_name(x)
    if name == "bfloat16":  # no numpy bfloat16: widen the bits (exact)
        bits = host_numpy(x).astype(np.uint32) << 16
        return bits.view(np.float32)
    return np.ascontiguousarray(host_numpy(x), dtype=_work_dtype(name))


def zfp_limit(dtype) -> float:
    """Magnitudes ZFP takes: its decoded values (error up to 2**(emax + 7 - R) at rate
    R >= 3) must stay finite, so 2**7 below the largest float of the working type."""
    return 2.0**1016 if str(dtype) == "float64" else 2.0**120


def _check_range(a: np.ndarray, spec: str) -> None:
    if not a.size:
        return
    lo, hi = a.min(), a.max()
    limit = zfp_limit(a.dtype)
    if not (-limit < lo and hi < limit):  # NaN fails both
        what = (
            "NaN"
            if np.isnan(lo) or np.isnan(hi)
            else "Inf"
            if np.isinf(lo) or np.isinf(hi)
            else f"|x| = {max(hi, -lo):.6g}"
        )
        raise DataError(
            f"codec {spec}: input contains {what}, outside ZFP's range "
            f"(finite, |x| < 2**{round(math.log2(limit))})"
        )


def _store(out, values: np.ndarray) -> None:
    """out[...] = values for a numpy array or a torch CPU tensor of any float dtype."""
    if isinstance(out, np.ndarray):
        out[...] = values
    else:
        import torch

        out.copy_(torch.from_numpy(values))


def _emax(amax: float) -> int:
    """The exponent with amax < 2**emax (frexp's), for amax > 0."""
    return math.frexp(amax)[1]


def _zfp_floor(dtype) -> float:
    """Magnitudes below which values are flushed to zero before ZFP.

    ZFP scales a block by 2**(30 - emax) (float) or 2**(62 - emax) (double) in the
    working type, which overflows for blocks below 2**-97 (float32) or 2**-960: the
    decoded values are then garbage (1e-30 comes back as -3.2e-30 at any rate). Flushing
    such values costs at most this absolute error, which the bounds include.
    """
    return 2.0**-960 if str(dtype) == "float64" else 2.0**-97


class _Zfp(Codec):
    lossy = True
    host_only = True
    granularity = 4  # ZFP's 1-D blocks

    def check_supported(self, buffer, dtype):
        super().check_supported(buffer, dtype)
        _zfpy()

    def _compress(self, x, **mode) -> bytes:
        work = _as_work(x)
        _check_range(work, self.spec)
        tiny = np.abs(work) < _zfp_floor(work.dtype)
        if tiny.any():
            work = np.where(tiny, work.dtype.type(0), work)
        return _zfpy().compress_numpy(work, write_header=False, **mode)

    def _decompress(self, body, out, **mode) -> None:
        zfpy = _zfpy()
        name = dtype_name(out)
        work = _work_dtype(name)
        n = out.shape[0]
        ztype = zfpy.dtype_to_ztype(np.dtype(work))
        direct = isinstance(out, np.ndarray) and out.dtype == work and out.flags.c_contiguous
        target = out if direct else np.empty(n, dtype=work)
        zfpy._decompress(host_numpy(body), ztype, [n], out=target, **mode)
        if not direct:
            if name == "bfloat16":
                import torch

                out.copy_(torch.from_numpy(target))
            else:
                _store(out, target.astype(host_numpy(out).dtype, copy=False))


class ZfpRateCodec(_Zfp):
    """ZFP fixed rate: R bits per value, size known before compressing."""

    name = "zfp"

    def __init__(self, spec: str, rate: int):
        super().__init__(spec)
        self.rate = rate

    def encoded_nbytes(self, count, dtype="float32"):
        blocks = -(-count // 4)
        return -(-(blocks * 4 * self.rate) // 64) * 8

    def _encode_into(self, x, payload):
        body = self._compress(x, rate=self.rate)
        if len(body) != payload.shape[0]:  # the size formula is part of the contract
            raise RuntimeError(
                f"zfp:rate={self.rate} wrote {len(body)} B for {x.shape[0]} "
                f"values, expected {payload.shape[0]} B"
            )
        host_numpy(payload)[...] = np.frombuffer(body, dtype=np.uint8)

    def _decode(self, payload, out):
        self._decompress(payload, out, rate=self.rate)

    def _error_bound(self, amax, dtype):
        # ZFP's fixed-rate mode has no closed-form bound. Searches over adversarial 1-D
        # blocks (random signs, spikes, mixed exponents) found at most
        # 2**(emax + 5.73 - R) for R >= 6 and 2**(emax + 1.58) below; we state
        # 2**(emax + 7 - R), at least one bit above every case measured, plus the
        # flush-to-zero floor.
        if amax == 0:
            return 0.0
        return 2.0 ** (_emax(amax) + 7 - self.rate) + _zfp_floor(dtype)


class ZfpTolCodec(_Zfp):
    """ZFP fixed accuracy: |error| <= tol, variable size."""

    name = "zfp"
    fixed_size = False

    def __init__(self, spec: str, tol: float):
        super().__init__(spec)
        self.tol = tol

    def encoded_nbytes(self, count, dtype="float32"):
        return None

    def max_encoded_nbytes(self, count, dtype="float32"):
        # zfp_stream_maximum_size: per 4-value block 1 + exponent + 3 group bits + 4 full
        # precision values, plus the header bits, in 64-bit words
        precision = 64 if dtype == "float64" else 32
        bits = -(-count // 4) * (12 + 4 * precision) + _ZFP_HEADER_BITS
        return 8 + -(-bits // 64) * 8 + 8

    def nominal_ratio(self, dtype="float32"):
        return float("nan")

    def _encode_bytes(self, x):
        return self._compress(x, tolerance=self.tol)

    def _decode(self, body, out):
        self._decompress(body, out, tolerance=self.tol)

    def _error_bound(self, amax, dtype):
        # ZFP meets the tolerance down to the precision of its integer transform (about
        # 30 bits below the block's largest value; we allow 24, or 52 for float64)
        if amax == 0:
            return 0.0
        precision = 52 if dtype == "float64" else 24
        return self.tol + 2.0 ** (_emax(amax) - precision) + _zfp_floor(dtype)


class ZstdCodec(Codec):
    """Lossless: byte shuffle, then zstd at `level` (variable size)."""

    name = "zstd"
    fixed_size = False
    host_only = True

    def __init__(self, spec: str, level: int = 1):
        super().__init__(spec)
        self.level = level
        self._compressor = None
        self._decompressor = None

    def check_supported(self, buffer, dtype):
        super().check_supported(buffer, dtype)
        _zstandard()

    def encoded_nbytes(self, count, dtype="float32"):
        return None

    def max_encoded_nbytes(self, count, dtype="float32"):
        n = count * itemsize(dtype)
        small = (128 * 1024 - n) >> 11 if n < 128 * 1024 else 0
        return 8 + n + (n >> 8) + small + 64  # ZSTD_COMPRESSBOUND + frame slack

    def nominal_ratio(self, dtype="float32"):
        return float("nan")

    def _encode_bytes(self, x):
        if self._compressor is None:
            self._compressor = _zstandard().ZstdCompressor(level=self.level)
        raw = host_numpy(x).view(np.uint8)
        size = itemsize(dtype_name(x))
        shuffled = np.ascontiguousarray(raw.reshape(-1, size).T)  # byte k of every value
        return self._compressor.compress(shuffled)

    def _decode(self, body, out):
        if self._decompressor is None:
            self._decompressor = _zstandard().ZstdDecompressor()
        raw = self._decompressor.decompress(host_numpy(body))
        size = itemsize(dtype_name(out))
        n = out.shape[0]
        if len(raw) != n * size:
            raise DataError(f"codec {self.spec}: payload holds {len(raw)} B, expected {n * size} B")
        shuffled = np.frombuffer(raw, dtype=np.uint8).reshape(size, n)
        host_numpy(out).view(np.uint8).reshape(n, size)[...] = shuffled.T
