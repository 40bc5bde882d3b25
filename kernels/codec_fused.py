"""Which kernels a codec runs, and the calls into the fused host kernels.

bfp, fp16 and bf16 have three implementations of one format:

* ``fused``: compiled host kernels (kernels/fused_*.c, built by ``pip install`` as
  ``ccbench.kernels._fused``), one pass over memory, for numpy arrays and torch CPU
  tensors (contiguous; bfp takes every float dtype through float32, the casts float32);
* ``device``: one CUDA kernel per encode, decode and reduce-scatter hop
  (kernels/codec_device.py), for cupy arrays and torch CUDA tensors where cupy is
  installed;
* ``reference``: the array-API kernels (codec_bfp.py, codec_cast.py), written once for
  every backend: the portable definition the other two are tested against.

The fused and device kernels write the reference's bytes and decode to its floats. Data
the fused kernels refuse (NaN, Inf, out of range) is handed back to the reference, which
raises its DataError; the device kernels' range check is deferred (codec_base:
check_deferred raises the reference's DataError), so every path fails alike.
``CCBENCH_CODEC_KERNELS=reference`` forces the reference everywhere (JSON sidecars
record CCBENCH_ variables); a codec object's ``kernels`` attribute does the same for that
codec alone.
"""

from __future__ import annotations

import array_api_compat
import numpy as np

from ccbench.kernels.codec_base import host_numpy, is_host, namespace

KERNELS_VERSION = 1  # fused_module.c's KERNELS_VERSION this file calls

_host = None  # the compiled module, False when it cannot be used
_host_note = ""
_device = None  # codec_device's kernels, False when they cannot be used
_device_note = ""


def host_kernels():
    """The compiled host kernels, or None (`note()` says why)."""
    global _host, _host_note
    if _host is None:
        try:
            from ccbench.kernels import _fused
        except ImportError:
            _host = False
            _host_note = (
                "fused host kernels not built (no C compiler when ccbench was "
                "installed): bfp, fp16, bf16 run their array-API kernels"
            )
        else:
            if getattr(_fused, "VERSION", None) == KERNELS_VERSION:
                _host = _fused
            else:
                _host = False
                _host_note = (
                    "fused host kernels are out of date (reinstall ccbench): bfp, "
                    "fp16, bf16 run their array-API kernels"
                )
    return _host or None


def note() -> str:
    """One line when the fused host kernels cannot be used, else ''."""
    host_kernels()
    return _host_note


def device_note() -> str:
    """One line when a GPU array found the device kernels unusable, else ''."""
    return _device_note


def device_kernels(x):
    """codec_device's kernels for a GPU array `x`, or None (cupy missing or unusable); a
    backend with kernels of its own (the tests' device double) names them itself."""
    global _device, _device_note
    from ccbench.kernels.arrays import backend_of

    own = backend_of(x).codec_kernels()
    if own is not None:
        return own
    if _device is None:
        try:
            from ccbench.kernels import codec_device

            codec_device.check()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the reference path
            _device = False
            _device_note = f"device kernels unavailable ({type(exc).__name__}: {exc})"
        else:
            _device = codec_device
    return _device or None


def _dtype(x) -> str:
    return str(x.dtype).rsplit(".", 1)[-1]


def _is_float32(x) -> bool:
    return _dtype(x) == "float32"


def _contiguous(x) -> bool:
    if array_api_compat.is_torch_array(x):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def path(codec, x, host_dtypes) -> str:
    """'fused', 'device' or 'reference': the kernels `codec` runs on the array `x`."""
    if codec.kernels == "reference":
        return "reference"
    if is_host(x):
        ok = _dtype(x) in host_dtypes and _contiguous(x)
        return "fused" if ok and host_kernels() is not None else "reference"
    if _is_float32(x) and _contiguous(x) and device_kernels(x) is not None:
        return "device"
    return "reference"


def _float32(x):
    """x as float32, converted as the reference converts it (xp.astype) if need be."""
    xp = namespace(x)
    return x if x.dtype == xp.float32 else xp.astype(x, xp.float32)


def _store(out, values: np.ndarray) -> None:
    """out[...] = float32 `values`, converted as the reference converts them."""
    if array_api_compat.is_torch_array(out):
        import torch

        out.copy_(torch.from_numpy(values))
    else:
        out[...] = values


# ------------------------------------------------------------------ bfp

# Arrays and payloads are contiguous 1-D host arrays (payloads are slices of one): the
# compiled functions take their buffers and check every size.


def bfp_encode(codec, x, payload, tile_width: int) -> bool:
    """Encode host `x` into `payload`. False: the data is out of range, nothing is
    promised about `payload`, and the reference must run (it raises)."""
    return host_kernels().bfp_encode(
        host_numpy(_float32(x)), host_numpy(payload), codec.block, tile_width, codec.rate
    )


def bfp_decode(codec, payload, out, tile_width: int) -> None:
    direct = str(out.dtype).endswith("float32")
    dest = host_numpy(out) if direct else np.empty(out.shape[0], np.float32)
    host_kernels().bfp_decode(host_numpy(payload), dest, codec.block, tile_width, codec.rate)
    if not direct:
        _store(out, dest)


def bfp_decode_add_encode(codec, payload, own, target, out, tile_width: int) -> bool:
    """target = decode(payload) + own (float32 host arrays), encoded into `out` if given.
    False: a sum is out of range; `target` holds all the sums."""
    dest = np.empty(0, np.uint8) if out is None else host_numpy(out)
    return host_kernels().bfp_decode_add_encode(
        host_numpy(payload),
        host_numpy(own),
        host_numpy(target),
        dest,
        codec.block,
        tile_width,
        codec.rate,
    )


# ------------------------------------------------------------------ casts (float32 only)


def cast_encode(x, payload, bfloat: bool) -> bool:
    """False: a value does not fit (the reference must run: it raises)."""
    return host_kernels().cast_encode(host_numpy(x), host_numpy(payload), bfloat)


def cast_decode(payload, out, bfloat: bool) -> None:
    host_kernels().cast_decode(host_numpy(payload), host_numpy(out), bfloat)


def cast_decode_add_encode(payload, own, target, out, bfloat: bool) -> bool:
    """False: a sum does not fit; `target` holds all the sums."""
    dest = np.empty(0, np.uint8) if out is None else host_numpy(out)
    return host_kernels().cast_decode_add_encode(
        host_numpy(payload), host_numpy(own), host_numpy(target), dest, bfloat
    )


def hop_path(codec, payload, own, target) -> str:
    """'fused', 'device' or 'reference': the kernels of a reduce-scatter hop. The fused
    and device kernels take float32 arrays of one kind (host or device) and a payload
    of that kind."""
    paths = {path(codec, a, ("float32",)) for a in (own, target)}
    if paths == {"fused"} and is_host(payload):
        return "fused"
    if paths == {"device"} and not is_host(payload):
        from ccbench.kernels.arrays import backend_of

        if backend_of(payload) is backend_of(target):
            return "device"
    return "reference"
