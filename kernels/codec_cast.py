"""Cast kernels of the fp16 / bf16 codecs: float array <-> 2-byte payload.

float32 host arrays run the fused host kernels (kernels/codec_fused.py) and GPU arrays
the device kernels where cupy is installed. The reference below: torch tensors use
torch's own conversion; numpy arrays borrow the same torch kernels through a zero-copy
`torch.from_numpy` view when torch is installed (numpy's float16 conversion runs at a
fraction of memory speed, and numpy has no bfloat16). Without torch (and on cupy) the
generic path runs: numpy/cupy float16 casts, and bfloat16 as round-to-nearest-even on
the float32 bit pattern. Every path rounds to nearest even and refuses NaN, Inf and
values that would round to Inf (|x| >= 65520 for float16, >= 2**128 - 2**119 for
bfloat16); values just above the largest finite one round down to it. On a device the
check is deferred (codec_base.Codec.check_deferred): nothing waits for the device.
"""

from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ccbench.kernels import codec_fused as fused
from ccbench.kernels.codec_base import Codec, is_host, rounding_error
from ccbench.kernels.errors import DataError

FLOAT16_MAX = 65504.0
BFLOAT16_MAX = 3.3895313892515355e38
# the smallest magnitudes that round to Inf (nearest even: half an ulp above the max)
FLOAT16_OVERFLOW = 65520.0
BFLOAT16_OVERFLOW = 2.0**128 - 2.0**119

_torch = None


def _torch_or_none():
    """torch if it can be imported, else None (looked up once)."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError:
            _torch = False
        else:
            _torch = torch
    return _torch or None


def _torch_dtype(target: str):
    import torch  # present: a torch view exists

    return torch.float16 if target == "float16" else torch.bfloat16


def _as_torch(x):
    """A torch view of a numpy array or a torch tensor itself; None if not possible."""
    if isinstance(x, np.ndarray):
        torch = _torch_or_none()
        return torch.from_numpy(x) if torch is not None and x.flags.writeable else None
    return x if array_api_compat.is_torch_array(x) else None


def cast_into(x, payload, target: str, spec: str) -> None:
    """Write `x` cast to `target` ('float16' or 'bfloat16') into the uint8 `payload`.

    Raises DataError for NaN, Inf or values the cast would turn into Inf.
    """
    tx, tp = _as_torch(x), _as_torch(payload)
    if tx is not None and tp is not None:
        import torch

        low = tp.view(_torch_dtype(target))
        low.copy_(tx)
        # overflow, NaN and Inf all leave a non-finite value behind: one pass over the
        # 2-byte result instead of a range check over the input
        if low.shape[0]:
            lo, hi = torch.aminmax(low)
            if not (math.isfinite(lo.item()) and math.isfinite(hi.item())):
                raise DataError(_bad_input(spec, target))
        return
    xp = array_api_compat.array_namespace(x)
    if target == "float16":
        if x.shape[0] and not _in_range(xp, x, FLOAT16_OVERFLOW):
            raise DataError(_bad_input(spec, target))
        payload.view(xp.float16)[...] = x
        return
    x32 = _f32(xp, x)  # float64 rounds to float32 first, and is checked there
    if x.shape[0] and not _in_range(xp, x32, BFLOAT16_OVERFLOW):
        raise DataError(_bad_input(spec, target))
    bits = x32.view(xp.uint32)
    # round to nearest even on the upper 16 bits (finite inputs: checked above)
    rounded = bits + (((bits >> 16) & 1) + 0x7FFF)
    payload.view(xp.uint16)[...] = rounded >> 16


INF_BITS = 0x7F800000
# the bits of the smallest float32 magnitude each cast refuses (the deferred check's limit)
OVERFLOW_BITS = {"float16": 0x477FF000, "bfloat16": 0x7F7F8000}


def cast_device(x, payload, target: str):
    """`cast_into` for device arrays, without the host's wait: writes the payload and
    returns the device int32 scalar the codec defers (INF_BITS if a value does not fit,
    else 0), so nothing waits for the device here."""
    tx, tp = _as_torch(x), _as_torch(payload)
    if tx is not None and tp is not None:
        import torch

        low = tp.view(_torch_dtype(target))
        low.copy_(tx)
        # overflow, NaN and Inf all leave a non-finite value behind
        bad = (
            torch.logical_not(torch.isfinite(low)).any()
            if low.shape[0]
            else (torch.zeros((), dtype=torch.bool, device=low.device))
        )
        return bad.to(torch.int32) * INF_BITS
    xp = array_api_compat.array_namespace(x)
    if target == "float16":
        ok = _fits(xp, x, FLOAT16_OVERFLOW)
        payload.view(xp.float16)[...] = x
    else:
        x32 = _f32(xp, x)
        ok = _fits(xp, x32, BFLOAT16_OVERFLOW)
        bits = x32.view(xp.uint32)
        payload.view(xp.uint16)[...] = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    return (1 - xp.astype(ok, xp.int32)) * INF_BITS


def _fits(xp, x, overflow: float):
    """A device bool scalar: every |x| < overflow (NaN fails), computed without a wait."""
    if not x.shape[0]:
        return xp.asarray(True, device=array_api_compat.device(x))
    return xp.logical_and(-overflow < xp.min(x), xp.max(x) < overflow)


def _in_range(xp, x, overflow: float) -> bool:
    # NaN propagates through max / min and fails both comparisons
    return bool(-overflow < xp.min(x)) and bool(xp.max(x) < overflow)


def _bad_input(spec: str, target: str) -> str:
    limit = FLOAT16_MAX if target == "float16" else BFLOAT16_MAX
    return (
        f"codec {spec}: input contains NaN, Inf or |x| > {limit:.6g} "
        f"(the largest {target}); refusing to send it"
    )


def uncast_into(payload, out, target: str) -> None:
    """Fill `out` from a payload written by `cast_into`."""
    tp, to = _as_torch(payload), _as_torch(out)
    if tp is not None and to is not None:
        to.copy_(tp.view(_torch_dtype(target)))
        return
    xp = array_api_compat.array_namespace(out)
    if target == "float16":
        out[...] = payload.view(xp.float16)
        return
    wide = xp.astype(payload.view(xp.uint16), xp.uint32) << 16
    out[...] = wide.view(xp.float32)


def _f32(xp, x):
    return x if x.dtype == xp.float32 else xp.astype(x, xp.float32)


class CastCodec(Codec):
    """Cast to float16 or bfloat16 (2 bytes per value), the DDP / Horovod hooks' codec."""

    lossy = True

    def __init__(self, spec: str, target: str):
        super().__init__(spec)
        self.name = "fp16" if target == "float16" else "bf16"
        self.target = target

    def encoded_nbytes(self, count, dtype="float32"):
        return 2 * count

    # dispatch: fused host kernels (float32), device kernels, or the reference above
    def kernel_path(self, x) -> str:
        return fused.path(self, x, ("float32",))

    def _encode_into(self, x, payload):
        path, bfloat = self.kernel_path(x), self.target == "bfloat16"
        if path == "fused" and fused.cast_encode(x, payload, bfloat):
            return
        if path == "device":  # the range check is read later (check_deferred)
            kernels = fused.device_kernels(x)
            kernels.cast_encode(x, payload, bfloat, self._range_flag(kernels, x))
            return
        if not is_host(x):
            self._defer(cast_device(x, payload, self.target))
            return
        cast_into(x, payload, self.target, self.spec)  # also where they refused the data

    def _range_error(self, worst):
        return _bad_input(self.spec, self.target) if worst >= OVERFLOW_BITS[self.target] else None

    def _decode(self, payload, out):
        path, payload = self.kernel_path(out), payload[: 2 * out.shape[0]]
        if path == "fused":
            fused.cast_decode(payload, out, self.target == "bfloat16")
        elif path == "device":
            fused.device_kernels(out).cast_decode(payload, out, self.target == "bfloat16")
        else:
            uncast_into(payload, out, self.target)

    def decode_add_encode(self, payload, own, target, out=None, scratch=None):
        n = target.shape[0]
        path = fused.hop_path(self, payload, own, target) if n else "reference"
        if path == "reference":
            return super().decode_add_encode(payload, own, target, out, scratch)
        payload_out = None if out is None else out[: 2 * n]
        if path == "device":  # a sum's range check is read later (check_deferred)
            kernels = fused.device_kernels(target)
            kernels.cast_decode_add_encode(
                payload[: 2 * n],
                own,
                target,
                payload_out,
                self.target == "bfloat16",
                self._range_flag(kernels, target),
            )
            return payload_out
        if not fused.cast_decode_add_encode(
            payload[: 2 * n], own, target, payload_out, self.target == "bfloat16"
        ):
            cast_into(target, payload_out, self.target, self.spec)  # raises the reference's
        return payload_out

    def _error_bound(self, amax, dtype):
        err = rounding_error(self.target, amax)
        if self.target == "bfloat16" and dtype == "float64":
            err += rounding_error("float32", amax)  # bf16 of float64 goes through float32
        return err
